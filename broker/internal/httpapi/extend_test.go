package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// fakeReclaim keeps one idle state per spawn and applies the policy's
// extension limit as the reclaimer does (the real one is tested in
// broker/internal/reclaim against Redis).
type fakeReclaim struct {
	mu     sync.Mutex
	limit  time.Duration
	states map[string]reclaim.IdleState
	actors []string
}

func (f *fakeReclaim) State(_ context.Context, srv fleet.Server) (reclaim.IdleState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.states[srv.SpawnID]
	st.SpawnID = srv.SpawnID
	return st, nil
}

func (f *fakeReclaim) Extend(_ context.Context, srv fleet.Server, d time.Duration, actor audit.Actor) (reclaim.IdleState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if srv.State != v1.StateRunning {
		return reclaim.IdleState{}, fmt.Errorf("%w: server %q is %s; only a running server can be extended", fleet.ErrConflict, srv.Name, srv.State)
	}
	st := f.states[srv.SpawnID]
	if st.Extended+d > f.limit {
		return reclaim.IdleState{}, fmt.Errorf("%w: this server can be extended by at most %s more", reclaim.ErrExtendLimit, f.limit-st.Extended)
	}
	st.Extended += d
	st.ExtendedUntil = testNow.Add(st.Extended)
	f.states[srv.SpawnID] = st
	f.actors = append(f.actors, actor.Name+" ("+actor.Kind+")")
	return st, nil
}

// Preview validates pol as the reclaimer does and answers, for every
// spawn with a state, its state and a warning that names pol's idle time.
func (f *fakeReclaim) Preview(_ context.Context, pol reclaim.Policy) ([]reclaim.PreviewServer, error) {
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []reclaim.PreviewServer
	for spawn, st := range f.states {
		st.SpawnID = spawn
		out = append(out, reclaim.PreviewServer{Server: fleet.Server{ServerKey: fleet.ServerKey{User: "alice", Name: "nb"}, Profile: "small", SpawnID: spawn},
			State: st, Actions: []reclaim.PreviewAction{{Action: "warn", Message: "idle past " + pol.IdleAfter.String()}}})
	}
	return out, nil
}

func newReclaimHarness(t *testing.T) (*harness, *fakeReclaim) {
	t.Helper()
	h := newHarness(t)
	fr := &fakeReclaim{limit: time.Hour, states: map[string]reclaim.IdleState{}}
	e, err := New(Deps{Servers: h.servers, Profiles: testProfiles, Fleet: h.fleet, Auth: fakeAuth{tokAlice: alice, tokBob: bob, tokHub: hub, tokAdmin: root},
		Reclaim: fr, Log: slog.New(slog.NewJSONHandler(h.logs, nil)), Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	h.e = e
	return h, fr
}

func TestExtendAndIdleRoutes(t *testing.T) {
	h, fr := newReclaimHarness(t)
	if rec := h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/nb", token: tokAlice, body: `{"profile":"small"}`}); rec.Code/100 != 2 {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	srv, _ := h.servers.Get(t.Context(), k)
	fr.states[srv.SpawnID] = reclaim.IdleState{Verdict: reclaim.VerdictIdle, Since: testNow.Add(-40 * time.Minute),
		NextAction: reclaim.ActionStop, NextAt: testNow.Add(20 * time.Minute)}

	steps := []struct {
		name       string
		r          req
		wantStatus int
		wantIn     string
	}{
		{"extend before running is a conflict", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokAlice, body: `{"seconds":600}`}, 409, "only a running server"},
		{"idle state", req{method: "GET", path: "/api/v1/users/alice/servers/nb/idle", token: tokAlice}, 200, `"verdict":"idle","since":"2026-11-29T14:20:00Z","exempt":false,"nextAction":"stop","nextAt":"2026-11-29T15:20:00Z"`},
		{"another user sees nothing", req{method: "GET", path: "/api/v1/users/alice/servers/nb/idle", token: tokBob}, 404, "no server"},
		{"another user cannot extend", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokBob, body: `{"seconds":600}`}, 404, "no server"},
		{"too short", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokAlice, body: `{"seconds":5}`}, 400, "between 60 and 604800"},
		{"unknown field", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokAlice, body: `{"minutes":5}`}, 400, "unknown field"},
	}
	run := func(steps []struct {
		name       string
		r          req
		wantStatus int
		wantIn     string
	}) {
		t.Helper()
		for _, s := range steps {
			rec := h.do(t, s.r)
			if rec.Code != s.wantStatus || !strings.Contains(rec.Body.String(), s.wantIn) {
				t.Errorf("%s: %d %s, want %d containing %s", s.name, rec.Code, rec.Body, s.wantStatus, s.wantIn)
			}
		}
	}
	run(steps)
	h.servers.advance(k, v1.StateRunning, "running")
	run([]struct {
		name       string
		r          req
		wantStatus int
		wantIn     string
	}{
		{"extend by 40 min", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokAlice, body: `{"seconds":2400}`}, 200, `"extendedUntil":"2026-11-29T15:40:00Z","extendedSeconds":2400`},
		{"the hub extends for the user", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokHub, body: `{"seconds":600}`}, 200, `"extendedSeconds":3000`},
		{"past the limit says what is left", req{method: "POST", path: "/api/v1/users/alice/servers/nb/extend", token: tokAlice, body: `{"seconds":1200}`}, 400, "at most 10m0s more"},
	})
	if diff := cmp.Diff([]string{"alice (user)", "jupyterhub (hub)"}, fr.actors); diff != "" {
		t.Errorf("actors (-want +got):\n%s", diff)
	}
}

func TestIdleStateBeforeTheFirstLook(t *testing.T) {
	got := toIdleState(reclaim.IdleState{SpawnID: "s"}, testNow)
	want := v1.IdleState{Verdict: v1.IdleUnchecked}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestPreviewRoute(t *testing.T) {
	h, fr := newReclaimHarness(t)
	since := testNow.Add(-40 * time.Minute)
	fr.states["sp1"] = reclaim.IdleState{Verdict: reclaim.VerdictIdle, Since: since, NextAction: reclaim.ActionStop, NextAt: testNow.Add(2 * time.Minute)}
	body := `{"version":0,"enabled":false,"idleComputePercent":5,"idleAfterSeconds":1800,"action":"stop","warnSeconds":120,"exemptGroups":["b"," a"]}`
	steps := []struct {
		name       string
		r          req
		wantStatus int
		wantIn     string
	}{
		{"users may not preview", req{method: "POST", path: "/api/v1/admin/reclaim-policy/preview", token: tokAlice, body: body}, 403, "administrators"},
		{"an invalid policy lists its fields", req{method: "POST", path: "/api/v1/admin/reclaim-policy/preview", token: tokAdmin,
			body: `{"version":0,"idleComputePercent":500,"idleAfterSeconds":1800,"action":"stop","warnSeconds":120}`}, 400, `"field":"idleComputePercent"`},
		{"unknown field", req{method: "POST", path: "/api/v1/admin/reclaim-policy/preview", token: tokAdmin, body: `{"colour":"red"}`}, 400, `unknown field`},
	}
	for _, s := range steps {
		if rec := h.do(t, s.r); rec.Code != s.wantStatus || !strings.Contains(rec.Body.String(), s.wantIn) {
			t.Errorf("%s: %d %s, want %d containing %s", s.name, rec.Code, rec.Body, s.wantStatus, s.wantIn)
		}
	}
	rec := h.do(t, req{method: "POST", path: "/api/v1/admin/reclaim-policy/preview", token: tokAdmin, body: body})
	if rec.Code != 200 {
		t.Fatalf("preview: %d %s", rec.Code, rec.Body)
	}
	got := decode[v1.ReclaimPreview](t, rec)
	next := testNow.Add(2 * time.Minute)
	want := v1.ReclaimPreview{
		Policy: v1.ReclaimPolicy{IdleComputePercent: 5, IdleAfterSeconds: 1800, Action: v1.ReclaimStop, WarnSeconds: 120, ExemptGroups: []string{"a", "b"}},
		At:     testNow,
		Servers: []v1.ReclaimPreviewServer{{User: "alice", Name: "nb", Profile: "small",
			Idle:    v1.IdleState{Verdict: v1.IdleIdle, Since: &since, NextAction: v1.ReclaimStop, NextAt: &next},
			Actions: []v1.ReclaimPreviewAction{{Action: "warn", Message: "idle past 30m0s"}}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("preview (-want +got):\n%s", diff)
	}
}
