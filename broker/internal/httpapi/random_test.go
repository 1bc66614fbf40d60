package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// randomRequests is how many requests TestRandomizedRequests sends: a
// fixed, seeded sample that runs in about a second, every time the same.
const randomRequests = 3000

// TestRandomizedRequests is a deterministic fuzz of the router and the
// request decoders: requests generated from a fixed seed (methods, path
// parameters with dots, escapes and odd scripts, query strings with
// unknown, repeated, empty and badly escaped parameters, headers, and
// JSON bodies mutated byte by byte, with duplicate keys, invalid UTF-8 and
// numbers out of range) go to every route. Whatever comes in, the answer
// is one openapi.yaml allows, never a redirect, never a 5xx other than a
// documented 503 (the fakes do not fail), and every error is a JSON Error.
func TestRandomizedRequests(t *testing.T) {
	resize := &fakeResizer{applied: true}
	h := newHarness(t, harnessConfig{policy: fakePolicy{}, audit: fakeAudit{}, reclaim: &fakeReclaim{},
		resize: resize, opts: []Option{WithEventsBlock(time.Millisecond)}})
	resize.servers = h.servers // a resize that passes the handler's checks resizes the harness's record
	seedAlice(t, h)
	rng := rand.New(rand.NewPCG(20261201, 11))
	routes := h.e.Routes() // in no fixed order: sorted, so that the seed decides every request
	slices.SortFunc(routes, func(a, b *echo.Route) int {
		return cmp.Or(strings.Compare(a.Path, b.Path), strings.Compare(a.Method, b.Method), strings.Compare(a.Name, b.Name))
	})
	statuses := map[int]int{}
	for i := range randomRequests {
		r := routes[rng.IntN(len(routes))]
		hr := randomRequest(t, rng, r.Method, r.Path)
		rec := httptest.NewRecorder()
		h.e.ServeHTTP(rec, hr)
		statuses[rec.Code]++
		label := fmt.Sprintf("#%d %s %s", i, hr.Method, hr.URL.RequestURI())
		switch {
		case rec.Code >= 300 && rec.Code < 400:
			t.Errorf("%s: redirect %d to %q", label, rec.Code, rec.Header().Get("Location"))
		case rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable:
			t.Errorf("%s: %d %s", label, rec.Code, rec.Body)
		}
		if err := contractError(hr, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
			t.Errorf("%s → %d: %v\nbody: %s", label, rec.Code, err, rec.Body)
		}
		if t.Failed() && i > 50 {
			break // the first failures say enough
		}
	}
	t.Logf("statuses: %v", statuses)
	if statuses[http.StatusBadRequest] == 0 || statuses[http.StatusOK]+statuses[http.StatusCreated] == 0 {
		t.Errorf("the sample is lopsided (%v): it must reach both refusals and successes", statuses)
	}
}

// pathValues are the path parameters tried, escaped as a client sends
// them: good names, names that are refused, and escapes of both.
var pathValues = []string{"alice", "lab", "nb", "bob", "GPU-1", "..", ".", "%2e%2e", "%2E", "a%2Fb", "%00", "%20lead",
	url.PathEscape("实验 1"), url.PathEscape("jürgen@example.com"), strings.Repeat("x", 300), "a%25b", "%E2%80%AE", "%ff"}

var queryNames = []string{"all", "user", "limit", "cursor", "remove", "lastEventId", "validate", "source", "actor",
	"action", "target", "server", "before", "zz", "Limit", ""}

var queryValues = []string{"true", "false", "maybe", "1", "0", "2", "1001", "-1", "abc", "alice", "", "%zz", "c:alice%00lab",
	"18446744073709551616-0", "1-0", "reclaim", "servers", "x;y", strings.Repeat("q", 2000)}

// bodies are valid bodies of every route's shape, the seeds of the
// mutations.
var bodies = []string{
	`{"profile":"small"}`,
	`{"profile":"small","env":{"A":"1"},"secretEnv":{"T":"s"},"command":["sh"],"args":["-c","true"]}`,
	`{"memoryMiB":16384}`, `{"computePercent":30,"computeLimitPercent":60}`,
	`{"seconds":3600}`,
	`{"node":"n1","memoryMiB":81920,"smCount":132,"healthy":true}`,
	`{"version":0,"enabled":true,"idleComputePercent":5,"idleAfterSeconds":3600,"action":"stop","warnSeconds":600,"overrides":[{"profile":"small","idleAfterSeconds":7200}]}`,
}

// mutate changes one thing about a JSON body, or nothing.
func mutate(rng *rand.Rand, body string) string {
	b := []byte(body)
	switch rng.IntN(12) {
	case 0:
		return body
	case 1: // a byte flipped
		if len(b) > 0 {
			b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		}
	case 2: // cut short
		b = b[:rng.IntN(len(b)+1)]
	case 3: // a duplicate first key
		if i := bytes.IndexByte(b, ','); i > 0 && b[0] == '{' {
			b = append(append([]byte("{"), b[1:i+1]...), b[1:]...)
		}
	case 4: // invalid UTF-8 in the first string
		if i := bytes.IndexByte(b, '"'); i >= 0 {
			b = append(append(append([]byte{}, b[:i+1]...), 0xc3, 0x28), b[i+1:]...)
		}
	case 5: // a number out of range
		b = []byte(strings.Replace(body, "1", "1e400", 1))
	case 6: // a key in another case
		b = bytes.ToUpper(b[:min(len(b), 4)])
		b = append(b, body[min(len(body), 4):]...)
	case 7:
		return `[]`
	case 8:
		return `{"` + strings.Repeat("a", 100) + `":{"b":[1,2,{"c":null}]}}`
	case 9:
		return body + body
	case 10:
		return `{"profile":"small","env":{"A":"1","A":"2"}}`
	case 11:
		return strings.Replace(body, `"`, `'`, 2)
	}
	return string(b)
}

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// randomRequest builds one request for a route of method and echo path.
func randomRequest(t *testing.T, rng *rand.Rand, method, route string) *http.Request {
	t.Helper()
	if rng.IntN(8) == 0 {
		method = pick(rng, []string{"GET", "PUT", "POST", "PATCH", "DELETE", "HEAD", "OPTIONS"})
	}
	var path strings.Builder
	for _, seg := range strings.Split(route, "/") {
		if seg == "" {
			continue
		}
		path.WriteString("/")
		if strings.HasPrefix(seg, ":") {
			if rng.IntN(3) == 0 {
				path.WriteString(pick(rng, pathValues))
			} else {
				path.WriteString(map[string]string{":user": "alice", ":name": "nb", ":uuid": "GPU-1"}[seg])
			}
			continue
		}
		path.WriteString(seg)
	}
	if strings.HasSuffix(route, "/") {
		path.WriteString("/")
	}
	var q []string
	for range max(0, rng.IntN(6)-3) {
		q = append(q, pick(rng, queryNames)+"="+pick(rng, queryValues))
	}
	target := path.String()
	if len(q) > 0 {
		target += "?" + strings.Join(q, pick(rng, []string{"&", "&", ";"}))
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		u = &url.URL{Path: "/api/v1/servers"} // net/http itself refuses such a request line
	}
	var body []byte
	if method != "GET" && method != "HEAD" && rng.IntN(6) != 0 {
		body = []byte(mutate(rng, pick(rng, bodies)))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond) // ends event streams
	t.Cleanup(cancel)
	hr := httptest.NewRequestWithContext(ctx, method, "/", bytes.NewReader(body))
	hr.URL = u
	hr.RequestURI = u.RequestURI()
	hr.Header.Set("Authorization", "Bearer "+pick(rng, []string{tokAlice, tokBob, tokAdmin, tokHub, tokExpired, tokIdPDown, "garbage"}))
	if len(body) > 0 || rng.IntN(4) == 0 {
		hr.Header.Set("Content-Type", pick(rng, []string{"application/json", "application/json", "application/json; charset=utf-8", "text/plain", "application/json; charset=latin1", "", "multipart/form-data; boundary=x"}))
	}
	if rng.IntN(3) == 0 {
		hr.Header.Set(HeaderIdempotencyKey, pick(rng, []string{"k1", "k 2", strings.Repeat("k", 300), "\x7f"}))
	}
	if rng.IntN(3) == 0 {
		hr.Header.Set(HeaderLastEventID, pick(rng, []string{"1-0", "0", "18446744073709551616-0", "1-18446744073709551616", "x", "-", "1-", strings.Repeat("9", 30)}))
	}
	if rng.IntN(3) == 0 {
		hr.Header.Set(v1.HeaderGroups, pick(rng, []string{"ml", "ml, ops", ",,,", "a/b", strings.Repeat("g,", 300)}))
	}
	return hr
}
