package frontend_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func TestServerPageOffersResizeWhileRunning(t *testing.T) {
	s := newSite(t, fakeSessions{v: alice}, baseAnswers())
	body := s.do(t, "GET", "/servers/nb", nil).Body.String()
	for _, want := range []string{
		`<form method="post" action="/servers/nb/resize"`,
		`name="csrf" value="` + csrf + `"`,
		`id="computePercent" name="computePercent" inputmode="numeric" value="` + strconv.Itoa(running.Slice.ComputePercent) + `"`,
		`id="memoryGiB" name="memoryGiB" inputmode="decimal" value="8"`,
		"Memory cannot shrink below what it uses now.",
		`<form method="post" action="/servers/nb/extend"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("running server's page lacks %q", want)
		}
	}
	if body := s.do(t, "GET", "/servers/new", nil).Body.String(); strings.Contains(body, "/resize") {
		t.Error("a server that is still starting offers resize")
	}
}

// fieldErrors reads a page's field errors (id → text) and the values of
// its inputs, as a person sees them.
var (
	errorRE = regexp.MustCompile(`<p class="error" id="([^"]+)-error">([^<]*)</p>`)
	inputRE = regexp.MustCompile(`<input id="([^"]+)" name="[^"]+" inputmode="[^"]+" value="([^"]*)"`)
	alertRE = regexp.MustCompile(`<div class="alert" role="alert"(?: id="[^"]+")?><p>([^<]*)</p>`)
)

type pageForm struct {
	Errors, Values map[string]string
	Problems       []string
}

func readPage(body string) pageForm {
	f := pageForm{Errors: map[string]string{}, Values: map[string]string{}}
	for _, m := range errorRE.FindAllStringSubmatch(body, -1) {
		f.Errors[m[1]] = html.UnescapeString(m[2])
	}
	for _, m := range inputRE.FindAllStringSubmatch(body, -1) {
		f.Values[m[1]] = html.UnescapeString(m[2])
	}
	for _, m := range alertRE.FindAllStringSubmatch(body, -1) {
		f.Problems = append(f.Problems, html.UnescapeString(m[1]))
	}
	return f
}

// TestServerFormsKeepTheUserWhereTheyWere: a refused resize or extend
// renders the server's page again, not an error page: every problem at
// once next to its field, one message each, the input as typed, in the
// form's units (GiB, percent, minutes); refusals of the API are turned
// into those units; nothing is sent while the form itself is wrong.
func TestServerFormsKeepTheUserWhereTheyWere(t *testing.T) {
	const patch = "PATCH /api/v1/users/alice/servers/nb/slice"
	const extend = "POST /api/v1/users/alice/servers/nb/extend"
	form := func(kv ...string) url.Values {
		v := url.Values{"csrf": {csrf}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	tests := []struct {
		name         string
		path         string
		form         url.Values
		api          string // the route answered
		answer       *answer
		wantStatus   int
		wantSent     string // the API body; "" = nothing sent
		wantErrors   map[string]string
		wantValues   map[string]string
		wantProblems []string
	}{
		{name: "a resize sends only what changes", path: "/servers/nb/resize",
			form: form("memoryGiB", "16", "computePercent", "10", "computeLimitPercent", "60"),
			api:  patch, answer: &answer{200, v1.ResizeResult{Server: running, Slice: running.Slice, Generation: 1, Applied: true}},
			wantStatus: http.StatusSeeOther, wantSent: `{"memoryMiB":16384,"computeLimitPercent":60}`},
		{name: "fractional GiB", path: "/servers/nb/resize",
			form: form("memoryGiB", "1.5", "computePercent", "10", "computeLimitPercent", "50"),
			api:  patch, answer: &answer{202, v1.ResizeResult{Server: running, Slice: running.Slice, Generation: 1}},
			wantStatus: http.StatusSeeOther, wantSent: `{"memoryMiB":1536}`},
		{name: "every problem at once, one each, as typed", path: "/servers/nb/resize",
			form:       form("memoryGiB", "lots", "computePercent", "101", "computeLimitPercent", "5"),
			wantStatus: http.StatusBadRequest,
			wantErrors: map[string]string{"memoryGiB": "Enter the GPU memory as a number of GiB above 0, for example 8 or 1.5.",
				"computePercent": "Enter a whole percent from 1 to 100."},
			wantValues: map[string]string{"memoryGiB": "lots", "computePercent": "101", "computeLimitPercent": "5", "minutes": "60"}},
		{name: "a limit below the guarantee", path: "/servers/nb/resize",
			form:       form("memoryGiB", "8", "computePercent", "30", "computeLimitPercent", "20"),
			wantStatus: http.StatusBadRequest,
			wantErrors: map[string]string{"computeLimitPercent": "The limit must be at least the guaranteed compute (30 %)."},
			wantValues: map[string]string{"memoryGiB": "8", "computePercent": "30", "computeLimitPercent": "20", "minutes": "60"}},
		{name: "the memory in use, in GiB", path: "/servers/nb/resize",
			form: form("memoryGiB", "4", "computePercent", "10", "computeLimitPercent", "50"),
			api:  patch, answer: &answer{409, v1.Error{Code: v1.CodeConflict, Message: "the notebook uses 6144 MiB now; memory cannot shrink below that",
				Limit: &v1.Limit{Kind: v1.LimitInUse, Resource: "memoryMiB", Limit: 6144, Want: 4096}}},
			wantStatus: http.StatusConflict, wantSent: `{"memoryMiB":4096}`,
			wantErrors: map[string]string{"memoryGiB": "The notebook uses 6 GiB of GPU memory now; memory cannot shrink below that."},
			wantValues: map[string]string{"memoryGiB": "4", "computePercent": "10", "computeLimitPercent": "50", "minutes": "60"}},
		{name: "the quota, in GiB", path: "/servers/nb/resize",
			form: form("memoryGiB", "64", "computePercent", "10", "computeLimitPercent", "50"),
			api:  patch, answer: &answer{403, v1.Error{Code: v1.CodeQuotaExceeded, Message: "user alice quota exceeded: …",
				Limit: &v1.Limit{Kind: v1.LimitQuota, Scope: "user", Name: "alice", Resource: "memoryMiB", Limit: 40960, Used: 8192, Want: 57344}}},
			wantStatus: http.StatusForbidden, wantSent: `{"memoryMiB":65536}`,
			wantErrors: map[string]string{"memoryGiB": "Your quota allows 40 GiB of GPU memory; 8 GiB are in use, and this needs 56 GiB more."},
			wantValues: map[string]string{"memoryGiB": "64", "computePercent": "10", "computeLimitPercent": "50", "minutes": "60"}},
		{name: "no room on the GPU, next to compute", path: "/servers/nb/resize",
			form: form("memoryGiB", "8", "computePercent", "90", "computeLimitPercent", "90"),
			api:  patch, answer: &answer{409, v1.Error{Code: v1.CodeNoCapacity, Message: "no room",
				Limit: &v1.Limit{Kind: v1.LimitGPU, Name: "node-a", Resource: "computePercent", Limit: 40, Want: 80}}},
			wantStatus: http.StatusConflict, wantSent: `{"computePercent":90,"computeLimitPercent":90}`,
			wantErrors: map[string]string{"computePercent": "No GPU has room for 80 % compute: the most any has free is 40 % compute (node node-a)."},
			wantValues: map[string]string{"memoryGiB": "8", "computePercent": "90", "computeLimitPercent": "90", "minutes": "60"}},
		{name: "nothing to change", path: "/servers/nb/resize",
			form:       form("memoryGiB", "8", "computePercent", "10", "computeLimitPercent", "50"),
			wantStatus: http.StatusBadRequest, wantProblems: []string{"Nothing to change: the slice already has these values."},
			wantValues: map[string]string{"memoryGiB": "8", "computePercent": "10", "computeLimitPercent": "50", "minutes": "60"}},
		{name: "an extension that is not a number", path: "/servers/nb/extend", form: form("minutes", "an hour"),
			wantStatus: http.StatusBadRequest,
			wantErrors: map[string]string{"minutes": "Enter a whole number of minutes from 1 to 10080 (7 days)."},
			wantValues: map[string]string{"minutes": "an hour", "memoryGiB": "8", "computePercent": "10", "computeLimitPercent": "50"}},
		{name: "an extension past the policy's limit, next to the minutes", path: "/servers/nb/extend", form: form("minutes", "600"),
			api: extend, answer: &answer{400, v1.Error{Code: v1.CodeBadRequest, Message: "this server can be extended by at most 3 h 20 min more (the limit is 4 h per start)"}},
			wantStatus: http.StatusBadRequest, wantSent: `{"seconds":36000}`,
			wantErrors: map[string]string{"minutes": "This server can be extended by at most 3 h 20 min more (the limit is 4 h per start)."},
			wantValues: map[string]string{"minutes": "600", "memoryGiB": "8", "computePercent": "10", "computeLimitPercent": "50"}},
		{name: "an extension", path: "/servers/nb/extend", form: form("minutes", "30"),
			api: extend, answer: &answer{200, map[string]any{"verdict": "idle", "exempt": false, "extendedSeconds": 1800}},
			wantStatus: http.StatusSeeOther, wantSent: `{"seconds":1800}`},
		{name: "without the CSRF token nothing is sent", path: "/servers/nb/resize", form: url.Values{"memoryGiB": {"16"}},
			wantStatus: http.StatusForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := baseAnswers()
			if tc.answer != nil {
				a[tc.api] = *tc.answer
			}
			s := newSite(t, fakeSessions{v: alice}, a)
			rec := s.do(t, "POST", tc.path, tc.form)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			var sent []string
			for _, w := range s.api.writes() {
				sent = append(sent, strings.TrimSpace(w.Body))
			}
			var wantSent []string
			if tc.wantSent != "" {
				wantSent = []string{tc.wantSent}
			}
			if diff := cmp.Diff(wantSent, sent); diff != "" {
				t.Errorf("API writes (-want +got):\n%s", diff)
			}
			if rec.Code == http.StatusSeeOther {
				if rec.Header().Get("Location") != "/servers/nb" {
					t.Errorf("redirect to %q, want /servers/nb", rec.Header().Get("Location"))
				}
				return
			}
			if tc.wantStatus == http.StatusForbidden && tc.wantValues == nil {
				return
			}
			body := rec.Body.String()
			if !strings.Contains(body, "<h1>Server nb</h1>") {
				t.Fatalf("not the server's page:\n%s", body)
			}
			got := readPage(body)
			if diff := cmp.Diff(tc.wantErrors, got.Errors, cmpEmpty); diff != "" {
				t.Errorf("field errors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantValues, got.Values); diff != "" {
				t.Errorf("inputs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantProblems, got.Problems, cmpEmpty); diff != "" {
				t.Errorf("form problems (-want +got):\n%s", diff)
			}
			for _, e := range got.Errors {
				if strings.Contains(e, "MiB") || strings.Contains(e, "seconds") {
					t.Errorf("error %q speaks in units the form does not use", e)
				}
			}
			for id := range tc.wantErrors {
				if !strings.Contains(body, `aria-describedby="`+id+`-hint `+id+`-error" aria-invalid="true"`) {
					t.Errorf("field %s is not marked invalid with its error", id)
				}
			}
		})
	}
}

// cmpEmpty treats nil and empty maps and slices alike.
var cmpEmpty = cmpopts.EquateEmpty()
