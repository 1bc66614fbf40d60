package frontend_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func TestServerPageOffersResizeWhileRunning(t *testing.T) {
	s := newSite(t, fakeSessions{v: alice}, baseAnswers())
	body := s.do(t, "GET", "/servers/nb", nil).Body.String()
	for _, want := range []string{
		`<form method="post" action="/servers/nb/resize"`,
		`name="csrf" value="` + csrf + `"`,
		`id="computePercent" name="computePercent" type="number" min="1" max="100" step="1" value="` + strconv.Itoa(running.Slice.ComputePercent) + `"`,
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

func TestResizeForm(t *testing.T) {
	const patch = "PATCH /api/v1/users/alice/servers/nb/slice"
	tests := []struct {
		name       string
		form       url.Values
		answer     *answer
		wantStatus int
		wantBody   string // sent to the API; "" = no call
		wantIn     string // in the page
	}{
		{
			name:       "all three fields",
			form:       url.Values{"csrf": {csrf}, "memoryGiB": {"16"}, "computePercent": {"30"}, "computeLimitPercent": {"60"}},
			answer:     &answer{200, v1.ResizeResult{Server: running, Slice: running.Slice, Generation: 1, Applied: true}},
			wantStatus: http.StatusSeeOther,
			wantBody:   `{"memoryMiB":16384,"computePercent":30,"computeLimitPercent":60}`,
		},
		{
			name:       "fractional GiB, other fields left empty",
			form:       url.Values{"csrf": {csrf}, "memoryGiB": {"1.5"}, "computePercent": {""}},
			answer:     &answer{202, v1.ResizeResult{Server: running, Slice: running.Slice, Generation: 1}},
			wantStatus: http.StatusSeeOther,
			wantBody:   `{"memoryMiB":1536}`,
		},
		{
			name:       "a refusal shows the API's words",
			form:       url.Values{"csrf": {csrf}, "memoryGiB": {"4"}},
			answer:     &answer{409, v1.Error{Code: v1.CodeConflict, Message: "the notebook uses 6144 MiB now; memory cannot shrink below that"}},
			wantStatus: http.StatusConflict,
			wantBody:   `{"memoryMiB":4096}`,
			wantIn:     "The notebook uses 6144 MiB now; memory cannot shrink below that.",
		},
		{
			name:       "not a number",
			form:       url.Values{"csrf": {csrf}, "memoryGiB": {"lots"}},
			wantStatus: http.StatusBadRequest,
			wantIn:     "GPU memory must be a positive number of GiB.",
		},
		{
			name:       "nothing to change",
			form:       url.Values{"csrf": {csrf}},
			wantStatus: http.StatusBadRequest,
			wantIn:     "Enter a new GPU memory or compute share.",
		},
		{
			name:       "without the CSRF token nothing is sent",
			form:       url.Values{"memoryGiB": {"16"}},
			wantStatus: http.StatusForbidden,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := baseAnswers()
			if tc.answer != nil {
				a[patch] = *tc.answer
			}
			s := newSite(t, fakeSessions{v: alice}, a)
			rec := s.do(t, "POST", "/servers/nb/resize", tc.form)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantStatus == http.StatusSeeOther && rec.Header().Get("Location") != "/servers/nb" {
				t.Errorf("redirect to %q, want /servers/nb", rec.Header().Get("Location"))
			}
			var got []string
			for _, w := range s.api.writes() {
				got = append(got, w.Method+" "+w.Path+" "+strings.TrimSpace(w.Body)+" csrf="+w.CSRF)
			}
			var want []string
			if tc.wantBody != "" {
				want = []string{patch + " " + tc.wantBody + " csrf=" + csrf}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("API writes (-want +got):\n%s", diff)
			}
			if tc.wantIn != "" && !strings.Contains(rec.Body.String(), tc.wantIn) {
				t.Errorf("page lacks %q:\n%s", tc.wantIn, rec.Body)
			}
		})
	}
}
