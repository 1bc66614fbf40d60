package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// TestErrorTable sends each kind of service error through a create and
// checks status, code, message and headers.
func TestErrorTable(t *testing.T) {
	capErr := &fleet.CapacityError{Want: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20}, Candidates: 4, LargestFreeMiB: 6144, LargestNode: "gpu-3"}
	quotaErr := &fleet.QuotaError{Scope: "user", Name: "alice", Resource: "memoryMiB", Limit: 16384, Used: 12288, Want: 8192}
	tests := []struct {
		name       string
		err        error
		wantStatus int
		want       v1.Error
		wantHeader map[string]string
	}{
		{name: "invalid, sentinel first", err: fmt.Errorf("%w: there is no profile %q", fleet.ErrInvalid, "huge"),
			wantStatus: 400, want: v1.Error{Code: v1.CodeBadRequest, Message: `there is no profile "huge"`}},
		{name: "invalid, sentinel last", err: fmt.Errorf("slice computePercent must be 1..100: %w", fleet.ErrInvalid),
			wantStatus: 400, want: v1.Error{Code: v1.CodeBadRequest, Message: "slice computePercent must be 1..100"}},
		{name: "invalid with joined problems", err: fmt.Errorf("%w: %w", fleet.ErrInvalid, errors.Join(errors.New("env A is reserved"), errors.New("env B is too long"))),
			wantStatus: 400, want: v1.Error{Code: v1.CodeBadRequest, Message: "env A is reserved; env B is too long"}},
		{name: "bare invalid", err: fleet.ErrInvalid,
			wantStatus: 400, want: v1.Error{Code: v1.CodeBadRequest, Message: "the request is not valid"}},
		{name: "forbidden", err: fmt.Errorf("%w: profile %q is not offered to your groups", fleet.ErrForbidden, "big"),
			wantStatus: 403, want: v1.Error{Code: v1.CodeForbidden, Message: `profile "big" is not offered to your groups`}},
		{name: "quota error keeps its own sentence", err: fmt.Errorf("place: %w", quotaErr),
			wantStatus: 403, want: v1.Error{Code: v1.CodeQuotaExceeded, Message: "user alice quota exceeded: you have 4 GiB of 16 GiB of GPU memory left; this needs 8 GiB",
				Limit: &v1.Limit{Kind: v1.LimitQuota, Scope: "user", Name: "alice", Resource: "memoryMiB", Limit: 16384, Used: 12288, Want: 8192}}},
		{name: "bare quota sentinel", err: fleet.ErrQuotaExceeded,
			wantStatus: 403, want: v1.Error{Code: v1.CodeQuotaExceeded, Message: "a quota would be exceeded"}},
		{name: "not found from the service", err: fmt.Errorf("%w: profile catalog entry vanished", fleet.ErrNotFound),
			wantStatus: 404, want: v1.Error{Code: v1.CodeNotFound, Message: "profile catalog entry vanished"}},
		{name: "capacity error keeps its own sentence", err: fmt.Errorf("place slice: %w", capErr),
			wantStatus: 409, want: v1.Error{Code: v1.CodeNoCapacity, Message: "no GPU has 8 GiB free; the largest free block is 6 GiB on node gpu-3",
				Limit: &v1.Limit{Kind: v1.LimitGPU, Name: "gpu-3", Resource: "memoryMiB", Limit: 6144, Want: 8192}}},
		{name: "no room on the server's own GPU", err: &fleet.RoomError{GPU: "GPU-1", Node: "n1", MaxMiB: 65536, MaxComputePercent: 40, Want: fleet.Slice{MemoryMiB: 81920, ComputePercent: 25}},
			wantStatus: 409, want: v1.Error{Code: v1.CodeNoCapacity, Message: "GPU GPU-1 on node n1 has room for at most 64 GiB and 40% compute for this slice; 80 GiB and 25% were asked",
				Limit: &v1.Limit{Kind: v1.LimitGPU, Scope: v1.LimitScopeServer, Name: "n1", Resource: "memoryMiB", Limit: 65536, Want: 81920}}},
		{name: "a state conflict speaks to the user, whatever wraps it", err: fmt.Errorf("server alice/nb: %w", &fleet.StateError{Key: fleet.ServerKey{User: "alice", Name: "nb"}, State: v1.StateStopping, Want: v1.StatePending}),
			wantStatus: 409, want: v1.Error{Code: v1.CodeConflict, Message: "nb is still stopping; start it again when it has stopped"}},
		{name: "Redis down is a 503 naming it", err: fmt.Errorf("create server: %w", &fleet.UnavailableError{Part: fleet.PartRedis, Err: context.DeadlineExceeded}),
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: "Redis (the broker's store) is not answering; try again in a few seconds"}, wantHeader: map[string]string{"Retry-After": "5"}},
		{name: "an outage midway says the outcome is unknown", err: &fleet.UnavailableError{Part: fleet.PartKubernetes, Unknown: "nb may or may not have started", Err: errBoom},
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: "the Kubernetes API server stopped answering midway, so nb may or may not have started; repeat the request in a few seconds (with the same Idempotency-Key) to find out"},
			wantHeader: map[string]string{"Retry-After": "5"}},
		{name: "conflict", err: fmt.Errorf("%w: server \"nb\" is running; stop it first", fleet.ErrConflict),
			wantStatus: 409, want: v1.Error{Code: v1.CodeConflict, Message: `server "nb" is running; stop it first`}},
		{name: "not ready asks to retry", err: fmt.Errorf("place: %w", fleet.ErrNotReady),
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: notReadyMessage}, wantHeader: map[string]string{"Retry-After": "5"}},
		{name: "bare not ready", err: fleet.ErrNotReady,
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: notReadyMessage}, wantHeader: map[string]string{"Retry-After": "5"}},
		{name: "store timeout", err: fmt.Errorf("redisstore: create server: %w", context.DeadlineExceeded),
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: "the broker timed out; try again"}, wantHeader: map[string]string{"Retry-After": "5"}},
		{name: "a store that does not answer asks to retry", err: fmt.Errorf("place slice s1: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}),
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: "the broker cannot reach its store or the cluster right now; try again in a few seconds"}, wantHeader: map[string]string{"Retry-After": "2"}},
		{name: "a connection cut mid-answer asks to retry", err: fmt.Errorf("transition: %w", io.EOF),
			wantStatus: 503, want: v1.Error{Code: v1.CodeUnavailable, Message: "the broker cannot reach its store or the cluster right now; try again in a few seconds"}, wantHeader: map[string]string{"Retry-After": "2"}},
		{name: "internal failure never shows its text", err: errBoom,
			wantStatus: 500, want: v1.Error{Code: v1.CodeInternal, Message: "internal error; quote request id req-1 when you report it"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.servers.failOn("create", tc.err)
			rec := h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/nb", token: tokAlice, body: `{"profile":"small"}`,
				header: map[string]string{"X-Request-ID": "req-1"}})
			if rec.Code != tc.wantStatus {
				t.Errorf("status = %d, want %d", rec.Code, tc.wantStatus)
			}
			if diff := cmp.Diff(tc.want, decode[v1.Error](t, rec)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			for k, v := range tc.wantHeader {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

// TestInternalErrorLoggedOnce checks that a 500 is logged exactly once,
// with the error text, the request id, the route and the user.
func TestInternalErrorLoggedOnce(t *testing.T) {
	h := newHarness(t)
	h.servers.failOn("list", errBoom)
	rec := h.do(t, req{method: "GET", path: "/api/v1/servers", token: tokAlice, header: map[string]string{"X-Request-ID": "req-42"}})
	if rec.Code != http.StatusInternalServerError || strings.Contains(rec.Body.String(), "10.0.0.7") {
		t.Fatalf("status %d, body %s", rec.Code, rec.Body)
	}
	var errorLines []map[string]any
	for _, l := range h.logs.lines(t) {
		if strings.Contains(fmt.Sprint(l["err"]), "10.0.0.7") {
			errorLines = append(errorLines, l)
		}
	}
	if len(errorLines) != 1 {
		t.Fatalf("error logged %d times, want once: %v", len(errorLines), h.logs.lines(t))
	}
	got := errorLines[0]
	want := map[string]any{"level": "ERROR", "msg": "request", "request_id": "req-42", "route": "/api/v1/servers", "user": "alice", "status": float64(500)}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("log %s = %v, want %v (line %v)", k, got[k], v, got)
		}
	}
}

func TestPanicIsA500(t *testing.T) {
	h := newHarness(t)
	h.servers.servers[fleet.ServerKey{User: "alice", Name: "panic"}] = fleet.Server{}
	rec := h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/panic", token: tokAlice})
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if got := decode[v1.Error](t, rec); got.Code != v1.CodeInternal || strings.Contains(got.Message, "nil map") {
		t.Errorf("error = %+v", got)
	}
	lines := h.logs.lines(t)
	last := lines[len(lines)-1]
	if last["level"] != "ERROR" || !strings.Contains(fmt.Sprint(last["err"]), "nil map write") || !strings.Contains(fmt.Sprint(last["stack"]), "fakeServers") {
		t.Errorf("panic log line = %v", last)
	}
}

func TestEchoErrors(t *testing.T) {
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		want       v1.Error
	}{
		{name: "unknown route", method: "GET", path: "/api/v1/nothing", wantStatus: 404,
			want: v1.Error{Code: v1.CodeNotFound, Message: "no route for GET /api/v1/nothing"}},
		{name: "unknown route without credentials is still 404", method: "GET", path: "/api/v1/nothing/else", wantStatus: 404,
			want: v1.Error{Code: v1.CodeNotFound, Message: "no route for GET /api/v1/nothing/else"}},
		{name: "wrong method", method: "PATCH", path: "/api/v1/users/alice/servers/nb", wantStatus: 405,
			want: v1.Error{Code: v1.CodeMethodNotAllowed, Message: "method PATCH is not allowed on /api/v1/users/alice/servers/nb"}},
		{name: "body over 1 MiB", method: "PUT", path: "/api/v1/users/alice/servers/nb",
			body: `{"profile":"small","env":{"A":"` + strings.Repeat("x", 1<<20) + `"}}`, wantStatus: 413,
			want: v1.Error{Code: v1.CodePayloadTooLarge, Message: "the request body is larger than 1 MiB (1048576 bytes)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			rec := h.do(t, req{method: tc.method, path: tc.path, token: tokAlice, body: tc.body})
			if rec.Code != tc.wantStatus {
				t.Errorf("status = %d, want %d", rec.Code, tc.wantStatus)
			}
			if diff := cmp.Diff(tc.want, decode[v1.Error](t, rec)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			if allow := rec.Header().Get("Allow"); tc.wantStatus == 405 && !strings.Contains(allow, "GET") {
				t.Errorf("405 with Allow %q", allow)
			}
		})
	}
}
