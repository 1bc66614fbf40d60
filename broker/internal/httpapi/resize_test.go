package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// fakeResizer answers every Resize with its result or error, on the
// fakeServers' record, and records the calls.
type fakeResizer struct {
	mu      sync.Mutex
	servers *fakeServers
	applied bool
	err     error
	calls   []resizeCall
}

type resizeCall struct {
	Key   fleet.ServerKey
	Want  fleet.Slice
	Actor string
}

var _ Resizer = (*fakeResizer)(nil)

func (f *fakeResizer) Resize(ctx context.Context, k fleet.ServerKey, want fleet.Slice, by audit.Actor) (fleet.ResizeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, resizeCall{k, want, by.Name})
	if f.err != nil {
		return fleet.ResizeResult{}, f.err
	}
	s, err := f.servers.Get(ctx, k)
	if err != nil {
		return fleet.ResizeResult{}, err
	}
	s.Slice = want
	res := fleet.ResizeResult{Server: s, Slice: want, Generation: 3, Applied: f.applied}
	if !f.applied {
		res.Deadline = testNow.Add(35 * time.Second)
	}
	return res, nil
}

// newResizeHarness is newHarness with the resize route served by r, and
// a running server alice/lab (8192 MiB, 20 %, limit 50 %).
func newResizeHarness(t *testing.T, r *fakeResizer) *harness {
	t.Helper()
	now := func() time.Time { return testNow }
	h := &harness{servers: newFakeServers(now), fleet: &fakeFleet{gpus: map[string]fleet.GPU{}}, logs: &syncBuffer{}}
	r.servers = h.servers
	e, err := New(Deps{
		Servers: h.servers, Profiles: testProfiles, Fleet: h.fleet, Resize: r, Reclaim: &fakeReclaim{},
		Auth: fakeAuth{tokAlice: alice, tokBob: bob, tokAdmin: root, tokHub: hub},
		Log:  slog.New(slog.NewJSONHandler(h.logs, nil)), Version: "1.2.3", Now: now,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.e = e
	k := fleet.ServerKey{User: "alice", Name: "lab"}
	if _, _, err := h.servers.Create(t.Context(), audit.Actor{}, "alice", nil, "lab", v1.CreateServerRequest{Profile: "small"}, "k"); err != nil {
		t.Fatal(err)
	}
	h.servers.advance(k, v1.StatePlacing, "placing")
	h.servers.advance(k, v1.StateRunning, "running")
	return h
}

func TestResizeRoute(t *testing.T) {
	const path = "/api/v1/users/alice/servers/lab/slice"
	deadline := testNow.Add(35 * time.Second)
	tests := []struct {
		name       string
		token      string
		path       string
		body       string
		header     map[string]string
		applied    bool
		err        error
		wantStatus int
		wantCode   string // error answers
		wantMsg    string // error answers
		wantCalls  []resizeCall
		wantResult *v1.ResizeResult
	}{
		{
			name: "applied is 200 with the new slice", token: tokAlice, path: path, body: `{"memoryMiB":16384}`, applied: true,
			wantStatus: http.StatusOK,
			wantCalls:  []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 16384, ComputePercent: 20, ComputeLimitPercent: 50}, "alice"}},
			wantResult: &v1.ResizeResult{Slice: v1.Slice{MemoryMiB: 16384, ComputePercent: 20, ComputeLimitPercent: 50}, Generation: 3, Applied: true},
		},
		{
			name: "pending is 202 with a deadline", token: tokAlice, path: path, body: `{"computePercent":30,"computeLimitPercent":90}`,
			wantStatus: http.StatusAccepted,
			wantCalls:  []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 8192, ComputePercent: 30, ComputeLimitPercent: 90}, "alice"}},
			wantResult: &v1.ResizeResult{Slice: v1.Slice{MemoryMiB: 8192, ComputePercent: 30, ComputeLimitPercent: 90}, Generation: 3, Deadline: &deadline},
		},
		{
			name: "a guarantee above the limit raises the limit", token: tokAlice, path: path, body: `{"computePercent":60}`, applied: true,
			wantStatus: http.StatusOK,
			wantCalls:  []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 8192, ComputePercent: 60, ComputeLimitPercent: 60}, "alice"}},
			wantResult: &v1.ResizeResult{Slice: v1.Slice{MemoryMiB: 8192, ComputePercent: 60, ComputeLimitPercent: 60}, Generation: 3, Applied: true},
		},
		{
			name: "an admin acts as themself", token: tokAdmin, path: path, body: `{"memoryMiB":4096}`, applied: true,
			wantStatus: http.StatusOK,
			wantCalls:  []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}, "root"}},
			wantResult: &v1.ResizeResult{Slice: v1.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}, Generation: 3, Applied: true},
		},
		{
			name: "the hub is named jupyterhub", token: tokHub, path: path, body: `{"memoryMiB":4096}`, applied: true,
			wantStatus: http.StatusOK,
			wantCalls:  []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}, "jupyterhub"}},
			wantResult: &v1.ResizeResult{Slice: v1.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}, Generation: 3, Applied: true},
		},
		{
			name: "a shrink below use is 409 with the figure", token: tokAlice, path: path, body: `{"memoryMiB":4096}`,
			err:        fmt.Errorf("%w: the notebook uses 6144 MiB now; memory cannot shrink below that", fleet.ErrConflict),
			wantStatus: http.StatusConflict, wantCode: v1.CodeConflict, wantMsg: "the notebook uses 6144 MiB now; memory cannot shrink below that",
			wantCalls: []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}, "alice"}},
		},
		{
			name: "a quota refusal is 403", token: tokAlice, path: path, body: `{"memoryMiB":65536}`,
			err:        &fleet.QuotaError{Scope: "user", Name: "alice", Resource: "memoryMiB", Limit: 40960, Used: 8192, Want: 57344},
			wantStatus: http.StatusForbidden, wantCode: v1.CodeQuotaExceeded,
			wantMsg:   "user alice quota exceeded: it allows 40960 MiB of slice memory; 8192 MiB are in use and this needs 57344 MiB more",
			wantCalls: []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 65536, ComputePercent: 20, ComputeLimitPercent: 50}, "alice"}},
		},
		{
			name: "no room on the GPU is 409 no_capacity", token: tokAlice, path: path, body: `{"memoryMiB":65536}`,
			err:        fmt.Errorf("%w: GPU GPU-1 on node gpu-1 has room for at most 40960 MiB and 80%% compute for this slice; 65536 MiB and 20%% were asked", fleet.ErrNoCapacity),
			wantStatus: http.StatusConflict, wantCode: v1.CodeNoCapacity,
			wantMsg:   "GPU GPU-1 on node gpu-1 has room for at most 40960 MiB and 80% compute for this slice; 65536 MiB and 20% were asked",
			wantCalls: []resizeCall{{fleet.ServerKey{User: "alice", Name: "lab"}, fleet.Slice{MemoryMiB: 65536, ComputePercent: 20, ComputeLimitPercent: 50}, "alice"}},
		},
		{
			name: "another user's server is 404 and untouched", token: tokBob, path: path, body: `{"memoryMiB":4096}`,
			wantStatus: http.StatusNotFound, wantCode: v1.CodeNotFound, wantMsg: `user "alice" has no server named "lab"`,
		},
		{
			name: "an unknown server is 404", token: tokAlice, path: "/api/v1/users/alice/servers/nope/slice", body: `{"memoryMiB":4096}`,
			wantStatus: http.StatusNotFound, wantCode: v1.CodeNotFound, wantMsg: `user "alice" has no server named "nope"`,
		},
		{
			name: "an unknown field is 400", token: tokAlice, path: path, body: `{"memory":4096}`,
			wantStatus: http.StatusBadRequest, wantCode: v1.CodeBadRequest,
		},
		{
			name: "no credentials is 401", path: path, body: `{"memoryMiB":4096}`,
			wantStatus: http.StatusUnauthorized, wantCode: v1.CodeUnauthorized,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeResizer{applied: tc.applied, err: tc.err}
			h := newResizeHarness(t, r)
			rec := h.do(t, req{method: http.MethodPatch, path: tc.path, token: tc.token, body: tc.body, header: tc.header})
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if diff := cmp.Diff(tc.wantCalls, r.calls); diff != "" {
				t.Errorf("Resize calls (-want +got):\n%s", diff)
			}
			if tc.wantCode != "" {
				e := decode[v1.Error](t, rec)
				if e.Code != tc.wantCode || (tc.wantMsg != "" && e.Message != tc.wantMsg) {
					t.Errorf("error = %+v, want code %s message %q", e, tc.wantCode, tc.wantMsg)
				}
				return
			}
			got := decode[v1.ResizeResult](t, rec)
			if got.Server.Slice != tc.wantResult.Slice || got.Server.User != "alice" {
				t.Errorf("server in the answer = %+v, want alice's with the new slice", got.Server)
			}
			got.Server = v1.Server{}
			if diff := cmp.Diff(*tc.wantResult, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResizeRouteNotServedWithoutResizer(t *testing.T) {
	h := newHarness(t)
	rec := h.do(t, req{method: http.MethodPatch, path: "/api/v1/users/alice/servers/lab/slice", token: tokAlice, body: `{"memoryMiB":1}`})
	if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("status = %d, want 404 or 405", rec.Code)
	}
}
