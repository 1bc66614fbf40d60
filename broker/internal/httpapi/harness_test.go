package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/labstack/echo/v4"
	"go.uber.org/goleak"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Tokens of the fake authenticator.
const (
	tokAlice   = "alice-token"
	tokBob     = "bob-token"
	tokAdmin   = "admin-token"
	tokHub     = "hub-token"
	tokExpired = "expired-token"
	tokIdPDown = "idp-down-token"
)

var (
	alice = auth.Principal{Subject: "sub-alice", User: "alice", Groups: []string{"ml"}}
	bob   = auth.Principal{Subject: "sub-bob", User: "bob"}
	root  = auth.Principal{Subject: "sub-root", User: "root", Groups: []string{"gpubroker-admins"}, Admin: true}
	hub   = auth.Principal{User: "jupyterhub", Hub: true}
)

// testProfiles: "small" for everyone, "big" for group ml only.
var testProfiles = fakeProfiles{
	{Name: "small", DisplayName: "Small", Image: "jupyter/minimal", CPU: "1", Memory: "2Gi",
		Slice: fleet.Slice{MemoryMiB: 4096, ComputePercent: 10, ComputeLimitPercent: 50}},
	{Name: "big", DisplayName: "Big", Image: "jupyter/pytorch", CPU: "4", Memory: "16Gi",
		Slice: fleet.Slice{MemoryMiB: 40960, ComputePercent: 50, ComputeLimitPercent: 100}, Groups: []string{"ml"}},
}

// harness is one API over fakes, with its log captured.
type harness struct {
	e       *echo.Echo
	servers *fakeServers
	fleet   *fakeFleet
	logs    *syncBuffer
}

type harnessConfig struct {
	policy   Policy  // nil: the reclaim routes are not served
	audit    Audit   // nil: the audit route is not served
	resize   Resizer // nil: the resize route is not served
	reclaim  Reclaim // nil: the idle, extend and preview routes are not served
	guar     Guarantees
	mode     Mode
	checkers []Checker
	metrics  Metrics
	opts     []Option
	openURL  func(user, name string) string
}

var testNow = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)

func newHarness(t *testing.T, cfgs ...harnessConfig) *harness {
	t.Helper()
	var cfg harnessConfig
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	now := func() time.Time { return testNow }
	h := &harness{
		servers: newFakeServers(now),
		fleet:   &fakeFleet{gpus: map[string]fleet.GPU{}},
		logs:    &syncBuffer{},
	}
	e, err := New(Deps{
		Servers:  h.servers,
		Profiles: testProfiles,
		Fleet:    h.fleet,
		Auth: fakeAuth{
			tokAlice: alice, tokBob: bob, tokAdmin: root, tokHub: hub,
			tokExpired: &auth.Error{Reason: "token expired at 2026-11-29T15:04:05Z"},
			tokIdPDown: errors.Join(auth.ErrUnavailable, errors.New("dial tcp 10.0.0.9:443: connection refused")),
		},
		Checkers:   cfg.checkers,
		Policy:     cfg.policy,
		Audit:      cfg.audit,
		Resize:     cfg.resize,
		Reclaim:    cfg.reclaim,
		Guarantees: cfg.guar,
		Log:        slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Version:    "1.2.3",
		Mode:       cfg.mode,
		Now:        now,
		Metrics:    cfg.metrics,
		OpenURL:    cfg.openURL,
	}, cfg.opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.e = e
	return h
}

// req describes one call.
type req struct {
	method, path, token, body string
	header                    map[string]string
}

// do runs r through e.ServeHTTP and checks the answer against openapi.yaml.
func (h *harness) do(t *testing.T, r req) *httptest.ResponseRecorder {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	hr := httptest.NewRequestWithContext(t.Context(), r.method, r.path, body)
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.body != "" {
		hr.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.e.ServeHTTP(rec, hr)
	checkContract(t, hr, rec.Code, rec.Header(), rec.Body.Bytes())
	return rec
}

// contract is openapi.yaml loaded once.
var contract = sync.OnceValues(func() (routers.Router, error) {
	doc, err := openapi3.NewLoader().LoadFromData(openapiYAML)
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, err
	}
	return legacy.NewRouter(doc)
})

// checkContract fails t unless contractError accepts the answer.
func checkContract(t *testing.T, r *http.Request, status int, header http.Header, body []byte) {
	t.Helper()
	if err := contractError(r, status, header, body); err != nil {
		t.Errorf("%s %s → %d: %v\nbody: %s", r.Method, r.URL.Path, status, err, body)
	}
}

// contractError says why an answer is not one openapi.yaml allows for the
// request: an undocumented status, or a body not matching its schema.
// Answers for routes the document does not have (unknown path or method)
// must be 404/405 with an Error body.
func contractError(r *http.Request, status int, header http.Header, body []byte) error {
	router, err := contract()
	if err != nil {
		return fmt.Errorf("openapi.yaml: %w", err)
	}
	// The document's router matches on the decoded path; the broker's on
	// the escaped one, where "a%2Fb" is one segment.
	if r.URL.RawPath != "" {
		r = r.Clone(r.Context())
		r.URL.Path = r.URL.EscapedPath()
		r.URL.RawPath = ""
	}
	route, params, err := router.FindRoute(r)
	if err == nil && status == http.StatusMethodNotAllowed && r.Method != http.MethodHead {
		// The router's answer for a method no route takes on this path
		// (the document's router may match it to a neighbour).
		return errorBodyError(body)
	}
	if err != nil {
		var re *routers.RouteError
		if !errors.As(err, &re) {
			return fmt.Errorf("find route: %w", err)
		}
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			return fmt.Errorf("route is not in openapi.yaml, yet answered %d", status)
		}
		if r.Method == http.MethodHead {
			return nil // answers to HEAD have no body
		}
		return errorBodyError(body)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("does not match openapi.yaml: %w", err)
	}
	// Every /api error is exactly a v1.Error (the schema allows no more).
	if status >= 400 && strings.HasPrefix(r.URL.Path, "/api/") && r.Method != http.MethodHead {
		return errorBodyError(body)
	}
	return nil
}

// errorBodyError says why body is not exactly a v1.Error with a code and
// a message.
func errorBodyError(body []byte) error {
	var e v1.Error
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return fmt.Errorf("body is not an Error: %w", err)
	}
	if e.Code == "" || e.Message == "" {
		return fmt.Errorf("error body lacks code or message")
	}
	return nil
}

// decode unmarshals the recorder's body into a T.
func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, rec.Body.String())
	}
	return v
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON log records written so far.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, l)
		}
		out = append(out, m)
	}
	return out
}
