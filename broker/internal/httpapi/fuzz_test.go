package httpapi

import (
	"net/http"
	"net/url"
	"testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// FuzzCreateServer sends arbitrary names, bodies and headers to the create
// route: whatever comes in, the answer is one openapi.yaml allows and never
// a 500 (the fake service does not fail).
func FuzzCreateServer(f *testing.F) {
	f.Add("nb", `{"profile":"small"}`, "k1", "ml")
	f.Add("实验", `{"profile":"small","env":{"A":"1"},"secretEnv":{"T":"s"}}`, "", "")
	f.Add("a\x00b", `{"profile":`, "key with space", ",,,")
	f.Add("..", `[]`, "\xff", "a,b,c")
	f.Add("x", `{"profile":"small","env":{"1":2}}`, "", "")
	f.Fuzz(func(t *testing.T, name, body, key, groups string) {
		h := newHarness(t)
		rec := h.do(t, req{
			method: http.MethodPut, path: "/api/v1/users/alice/servers/" + url.PathEscape(name), token: tokHub, body: body,
			header: map[string]string{HeaderIdempotencyKey: key, v1.HeaderGroups: groups},
		})
		if rec.Code >= 500 {
			t.Errorf("status %d: %s", rec.Code, rec.Body)
		}
	})
}
