package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestContractCatchesDrift makes sure the OpenAPI check used by every
// other test can fail: answers that drift from openapi.yaml are refused.
func TestContractCatchesDrift(t *testing.T) {
	jsonHdr := http.Header{"Content-Type": []string{"application/json"}}
	tests := []struct {
		name    string
		method  string
		path    string
		status  int
		body    string
		wantErr bool
	}{
		{name: "documented answer passes", method: "GET", path: "/healthz", status: 200, body: `{"status":"ok"}`},
		{name: "undocumented status", method: "GET", path: "/healthz", status: 418, body: `{"status":"ok"}`, wantErr: true},
		{name: "undocumented field", method: "GET", path: "/healthz", status: 200, body: `{"status":"ok","extra":1}`, wantErr: true},
		{name: "missing required field", method: "GET", path: "/api/v1/me", status: 200, body: `{"user":"a","groups":[],"admin":false}`, wantErr: true},
		{name: "wrong enum in error code", method: "GET", path: "/api/v1/me", status: 401, body: `{"code":"nope","message":"m"}`, wantErr: true},
		{name: "unknown route must be 404 or 405", method: "GET", path: "/api/v1/nope", status: 200, body: `{"code":"not_found","message":"m"}`, wantErr: true},
		{name: "unknown route 404 with an Error", method: "GET", path: "/api/v1/nope", status: 404, body: `{"code":"not_found","message":"m"}`},
		{name: "server with wrong state", method: "GET", path: "/api/v1/users/a/servers/b", status: 200, wantErr: true,
			body: `{"user":"a","name":"b","profile":"p","spawnId":"s","state":"dancing","message":"m","slice":{"memoryMiB":1,"computePercent":1,"computeLimitPercent":1},"createdAt":"2026-11-29T15:00:00Z","updatedAt":"2026-11-29T15:00:00Z"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			err := contractError(r, tc.status, jsonHdr, []byte(tc.body))
			if (err != nil) != tc.wantErr {
				t.Errorf("contractError = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
