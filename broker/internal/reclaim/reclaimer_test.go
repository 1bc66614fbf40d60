package reclaim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// clock is a fake clock safe for concurrent use.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// notebook is a Jupyter server's activity API with settable state; it
// refuses any request without no_track_activity=1, as a probe that counted
// as activity would be a bug.
type notebook struct {
	mu           sync.Mutex
	busyKernels  int
	idleKernels  int
	lastActivity time.Time
	failStatus   int    // non-zero: every request answers this status
	tracked      int    // requests that lacked no_track_activity=1
	token        string // non-empty: requests without "Authorization: token <token>" get 403
	srv          *httptest.Server
}

func newNotebook(t *testing.T, last time.Time) *notebook {
	t.Helper()
	nb := &notebook{lastActivity: last}
	nb.srv = httptest.NewServer(http.HandlerFunc(nb.serve))
	t.Cleanup(nb.srv.Close)
	return nb
}

func (nb *notebook) set(f func(nb *notebook)) { nb.mu.Lock(); defer nb.mu.Unlock(); f(nb) }

func (nb *notebook) serve(w http.ResponseWriter, r *http.Request) {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	if r.URL.Query().Get("no_track_activity") != "1" {
		nb.tracked++
		http.Error(w, "tracked", http.StatusBadRequest)
		return
	}
	if nb.failStatus != 0 {
		http.Error(w, "broken", nb.failStatus)
		return
	}
	if nb.token != "" && r.Header.Get("Authorization") != "token "+nb.token {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	last := nb.lastActivity.UTC().Format(time.RFC3339Nano)
	var body any
	switch strings.TrimPrefix(r.URL.Path, "/user/ada/") {
	case "api/status":
		body = map[string]any{"started": last, "last_activity": last, "connections": 0, "kernels": nb.busyKernels + nb.idleKernels}
	case "api/kernels":
		var ks []map[string]any
		for i := 0; i < nb.busyKernels+nb.idleKernels; i++ {
			st := "idle"
			if i < nb.busyKernels {
				st = "busy"
			}
			ks = append(ks, map[string]any{"id": "k", "name": "python3", "last_activity": last, "execution_state": st, "connections": 0})
		}
		if ks == nil {
			ks = []map[string]any{}
		}
		body = ks
	case "api/terminals":
		body = []any{}
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// stopper stops through the store like servers.Service.Delete does for a
// pod that is already gone, and counts the calls.
type stopper struct {
	store *redisstore.Store
	mu    sync.Mutex
	calls int
}

func (s *stopper) Delete(ctx context.Context, _ audit.Actor, k fleet.ServerKey) (fleet.Server, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	rec, err := s.store.GetServer(ctx, k)
	if err != nil {
		return rec, err
	}
	if _, err := s.store.Transition(ctx, k, rec.SpawnID, v1.StateStopping, "stopping: deleting the pod", fleet.ServerPatch{}); err != nil {
		return rec, err
	}
	return s.store.Transition(ctx, k, rec.SpawnID, v1.StateStopped, "stopped", fleet.ServerPatch{})
}

// quotaShrinker shrinks and restores compute through the node agent's
// desired quota only, as the resize service does last; the tests read the
// desired quota back to see what the reclaimer asked for.
func quotaShrinker(agents *agentstore.Store) reclaim.ShrinkFunc {
	return func(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error {
		sl := srv.Slice
		sl.ComputePercent, sl.ComputeLimitPercent = computePercent, max(computeLimitPercent, computePercent)
		_, err := agents.SetDesiredQuota(ctx, srv.SpawnID, sl)
		return err
	}
}

type fixture struct {
	t        *testing.T
	prefix   string
	clock    *clock
	rdb      *redis.Client
	store    *redisstore.Store
	agents   *agentstore.Store
	policies *reclaim.Policies
	states   *redisstore.Reclaim
	log      *redisstore.AuditLog
	stopper  *stopper
	rec      *reclaim.Reclaimer
}

const interval = 30 * time.Second

func newFixture(t *testing.T) *fixture {
	t.Helper()
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	prefix := rs.Prefix(t)
	c := &clock{now: t0}
	store := redisstore.New(rdb, prefix, redisstore.WithClock(c.Now))
	agents := agentstore.New(rdb, prefix)
	states := redisstore.NewReclaim(rdb, prefix)
	log := redisstore.NewAuditLog(rdb, prefix, nil)
	policies := reclaim.NewPolicies(states, c.Now)
	st := &stopper{store: store}
	f := &fixture{t: t, prefix: prefix, clock: c, rdb: rdb, store: store, agents: agents, policies: policies,
		states: states, log: log, stopper: st}
	f.rec = f.reclaimer(nil)
	return f
}

// reclaimer builds a Reclaimer over the fixture's parts, telling hub (if
// not nil) about busy servers.
func (f *fixture) reclaimer(hub reclaim.HubNotifier) *reclaim.Reclaimer {
	f.t.Helper()
	return f.reclaimerWith(reclaim.Config{Hub: hub, Prober: reclaim.NewProber(nil, 0, nil)})
}

// reclaimerWith builds a Reclaimer over the fixture's parts with cfg's
// Hub, Prober and Proxy.
func (f *fixture) reclaimerWith(cfg reclaim.Config) *reclaim.Reclaimer {
	f.t.Helper()
	rec, err := reclaim.New(reclaim.Config{
		Policies: f.policies, Audit: f.log, States: f.states, Samples: redisstore.AgentSamples{Agents: f.agents},
		Servers: f.store, Stopper: f.stopper, Shrinker: quotaShrinker(f.agents),
		Prober: cfg.Prober, Hub: cfg.Hub, Proxy: cfg.Proxy, Interval: interval, Now: f.clock.Now,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

func (f *fixture) policy(p reclaim.Policy) reclaim.Policy {
	f.t.Helper()
	cur, err := f.policies.Get(f.t.Context())
	if err != nil {
		f.t.Fatal(err)
	}
	p.Version = cur.Version
	saved, err := f.policies.Put(f.t.Context(), p, "admin")
	if err != nil {
		f.t.Fatal(err)
	}
	return saved
}

var slice = fleet.Slice{MemoryMiB: 8192, ComputePercent: 40, ComputeLimitPercent: 100}

// server writes a running server of ada with spawn id and notebook nb.
func (f *fixture) server(name, spawn string, nb *notebook, groups ...string) fleet.Server {
	f.t.Helper()
	srv := fleet.Server{
		ServerKey: fleet.ServerKey{User: "ada", Name: name}, Profile: "small", SpawnID: spawn, State: v1.StateRunning,
		Slice: slice, URL: nb.srv.URL + "/user/ada/", CreatedAt: f.clock.Now(),
		Allocation: &fleet.Allocation{SliceID: spawn, User: "ada", Groups: groups, Slice: slice, GPUUUID: "GPU-1", Node: "n1"},
	}
	if ok, err := f.store.RestoreServer(f.t.Context(), srv); err != nil || !ok {
		f.t.Fatalf("restore server: %v %v", ok, err)
	}
	return srv
}

func (f *fixture) sample(spawn string, sm int) {
	f.t.Helper()
	zero := time.Time{}
	if err := f.agents.AddSamples(f.t.Context(), []agentstore.Sample{{
		Slice: spawn, At: f.clock.Now(), Interval: 10 * time.Second, SMPercent: &sm, LastKernel: &zero,
	}}); err != nil {
		f.t.Fatal(err)
	}
}

// run advances the clock by interval and runs a cycle, d/interval times;
// sm returns the SM % the agent reports for spawn at each step (a negative
// value: no sample).
func (f *fixture) run(d time.Duration, spawn string, sm func(time.Time) int) {
	f.t.Helper()
	for end := f.clock.Now().Add(d); f.clock.Now().Before(end); {
		now := f.clock.Add(interval)
		if v := sm(now); v >= 0 {
			f.sample(spawn, v)
		}
		if _, err := f.rec.Cycle(f.t.Context()); err != nil {
			f.t.Fatalf("cycle at %s: %v", now.Format("15:04:05"), err)
		}
	}
}

func constSM(v int) func(time.Time) int { return func(time.Time) int { return v } }

func (f *fixture) get(name string) fleet.Server {
	f.t.Helper()
	s, err := f.store.GetServer(f.t.Context(), fleet.ServerKey{User: "ada", Name: name})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) audit() []audit.Entry {
	f.t.Helper()
	es, _, err := f.log.Audit(f.t.Context(), audit.Query{Actor: reclaim.Actor, Limit: 200})
	if err != nil {
		f.t.Fatal(err)
	}
	return es
}

func (f *fixture) state(name string) reclaim.IdleState {
	f.t.Helper()
	st, err := f.rec.State(f.t.Context(), f.get(name))
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// ada is the servers' user as an audit actor.
var ada = audit.Actor{Name: "ada", Kind: v1.ActorUser}

// stopPolicy stops after 10 idle minutes with 2 minutes' warning.
func stopPolicy() reclaim.Policy {
	p := reclaim.DefaultPolicy()
	p.Enabled, p.IdleAfter, p.Action, p.Warn = true, 10*time.Minute, reclaim.ActionStop, 2*time.Minute
	return p
}

// checkOutcome compares server name's outcome with want; with inWhy the
// reason must contain it instead of equalling want's.
func (f *fixture) checkOutcome(name string, want outcome, inWhy string) {
	f.t.Helper()
	st := f.state(name)
	got := outcome{State: f.get(name).State, Verdict: st.Verdict, Reason: st.Reason, Audits: len(f.audit()), Stops: f.stopper.calls}
	if inWhy != "" {
		if !strings.Contains(st.Reason, inWhy) {
			f.t.Errorf("reason %q does not contain %q", st.Reason, inWhy)
		}
		got.Reason = ""
	}
	if diff := cmp.Diff(want, got); diff != "" {
		f.t.Errorf("outcome (-want +got):\n%s", diff)
	}
}

type outcome struct {
	State   v1.ServerState
	Verdict reclaim.Verdict
	Reason  string
	Audits  int
	Stops   int
}

func TestNotReclaimed(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(nb *notebook)
		sm      func(time.Time) int
		groups  []string
		want    outcome
		inWhy   string
		dryAuds bool
	}{
		{name: "a silent busy kernel with an idle GPU is active", setup: func(nb *notebook) { nb.busyKernels = 1 },
			sm: constSM(0), want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictActive, Reason: "a kernel is running code"}},
		{name: "a busy GPU without browser or kernel traffic is active", setup: func(nb *notebook) {},
			sm: constSM(80), want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictActive, Reason: "the GPU is busy"}},
		{name: "a failing activity probe is unknown with the reason", setup: func(nb *notebook) { nb.failStatus = http.StatusBadGateway },
			sm: constSM(0), want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictUnknown}, inWhy: "api/status answered 502 Bad Gateway"},
		{name: "stale samples are unknown", setup: func(nb *notebook) {},
			sm: func(now time.Time) int {
				if now.Sub(t0) > 2*time.Minute {
					return -1 // the agent stopped reporting
				}
				return 0
			}, want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictUnknown}, inWhy: "the GPU samples are stale"},
		{name: "an agent that never reported is unknown", setup: func(nb *notebook) {},
			sm: constSM(-1), want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictUnknown}, inWhy: "no GPU samples"},
		{name: "an exempt group is never reclaimed", setup: func(nb *notebook) {}, groups: []string{"vip"},
			sm: constSM(0), want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictIdle}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p := stopPolicy()
			p.ExemptGroups = []string{"vip"}
			f.policy(p)
			nb := newNotebook(t, t0.Add(-time.Hour))
			nb.set(tc.setup)
			f.server("a", "spawn-1", nb, tc.groups...)
			f.run(45*time.Minute, "spawn-1", tc.sm)
			f.checkOutcome("a", tc.want, tc.inWhy)
			if nb.tracked != 0 {
				t.Errorf("%d probes lacked no_track_activity=1", nb.tracked)
			}
		})
	}
}

// TestNotebookTokenAndProxyActivity probes a notebook that takes only its
// own token, through the prober's target, and adds the notebook proxy's
// activity: a recent request through the proxy keeps an otherwise idle
// server, an old one or none does not, and a refused probe is unknown.
func TestNotebookTokenAndProxyActivity(t *testing.T) {
	tests := []struct {
		name  string
		token string        // what the target hands the prober
		last  time.Duration // proxy's last request before the end; 0: no record
		want  outcome
		inWhy string
	}{
		{name: "a recent request through the proxy keeps it", token: "nb-tok", last: 20 * time.Second,
			want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictActive, Reason: "the notebook was used through the broker recently"}},
		{name: "an old request through the proxy does not", token: "nb-tok", last: time.Hour,
			want: outcome{State: v1.StateStopped, Verdict: reclaim.VerdictIdle, Audits: 2, Stops: 1}},
		{name: "no proxy record does not", token: "nb-tok",
			want: outcome{State: v1.StateStopped, Verdict: reclaim.VerdictIdle, Audits: 2, Stops: 1}},
		{name: "a notebook refusing the probe is unknown, whatever the proxy saw", token: "wrong", last: time.Hour,
			want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictUnknown}, inWhy: "api/status answered 403 Forbidden"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.policy(stopPolicy())
			nb := newNotebook(t, t0.Add(-time.Hour))
			nb.set(func(nb *notebook) { nb.token = "nb-tok" })
			proxyStore := redisstore.NewNotebooks(f.rdb, f.prefix)
			f.rec = f.reclaimerWith(reclaim.Config{Proxy: proxyStore,
				Prober: reclaim.NewProber(nil, 0, func(_ context.Context, s fleet.Server) (string, string, error) { return s.URL, tc.token, nil })})
			f.server("a", "spawn-1", nb)
			end := t0.Add(45 * time.Minute)
			if tc.last > 0 {
				// The proxy keeps writing its record, as replicas flush.
				f.run(45*time.Minute, "spawn-1", func(now time.Time) int {
					at := end.Add(-tc.last)
					if at.After(now) {
						at = now.Add(-tc.last)
					}
					if err := proxyStore.PutActivity(t.Context(), "spawn-1", "r1", fleet.ProxyActivity{LastRequest: at}, now); err != nil {
						t.Fatal(err)
					}
					return 0
				})
			} else {
				f.run(45*time.Minute, "spawn-1", constSM(0))
			}
			f.checkOutcome("a", tc.want, tc.inWhy)
		})
	}
}

// A control: the same setup with nothing busy is stopped, so the cases
// above can fail.
func TestIdleServerIsStopped(t *testing.T) {
	f := newFixture(t)
	f.policy(stopPolicy())
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", nb)
	f.run(45*time.Minute, "spawn-1", constSM(0))
	if got := f.get("a").State; got != v1.StateStopped {
		t.Fatalf("state %s, want stopped", got)
	}
	if f.stopper.calls != 1 {
		t.Errorf("stop calls %d, want 1", f.stopper.calls)
	}
}

func TestLadderRunsInOrderWithTheConfiguredTimes(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.Action, p.ShrinkComputePercent, p.StopAfter = reclaim.ActionShrink, 5, 20*time.Minute
	saved := f.policy(p)
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", nb)
	start := f.clock.Now().Add(interval) // the first cycle starts the idle clock
	f.run(25*time.Minute, "spawn-1", constSM(0))

	type step struct {
		Action  string
		After   time.Duration
		Version int64
	}
	var got []step
	es := f.audit()
	for i := len(es) - 1; i >= 0; i-- {
		got = append(got, step{es[i].Action, es[i].Time.Sub(start), es[i].PolicyVersion})
	}
	want := []step{
		{reclaim.AuditWarn, 8 * time.Minute, saved.Version},
		{reclaim.AuditShrink, 10 * time.Minute, saved.Version},
		{reclaim.AuditWarn, 18 * time.Minute, saved.Version},
		{reclaim.AuditStop, 20 * time.Minute, saved.Version},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("ladder (-want +got):\n%s", diff)
	}
	q, err := f.agents.DesiredQuota(t.Context(), "spawn-1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(fleet.Slice{MemoryMiB: 8192, ComputePercent: 5, ComputeLimitPercent: 5}, q.Slice); diff != "" {
		t.Errorf("desired quota after shrink (-want +got):\n%s", diff)
	}
	evs, err := f.store.Events(t.Context(), fleet.ServerKey{User: "ada", Name: "a"}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, e := range evs {
		msgs = append(msgs, e.Message)
	}
	wantMsgs := []string{
		redisstore.RestoreMessage,
		"idle for 8 min; compute will shrink to 5 % at 15:10:30 UTC unless extended",
		"idle for 10 min; compute shrunk to 5 % of the GPU until the server is busy again",
		"idle for 18 min; will stop at 15:20:30 UTC unless extended (your files are kept)",
		"idle for 20 min; stopping the server (your files are kept)",
		"stopping: deleting the pod",
		"stopped",
	}
	if diff := cmp.Diff(wantMsgs, msgs); diff != "" {
		t.Errorf("events the user sees (-want +got):\n%s", diff)
	}
}

func TestDryRunOnlyWritesAuditRecords(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.DryRun = true
	f.policy(p)
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", nb)
	f.run(45*time.Minute, "spawn-1", constSM(0))

	if got := f.get("a").State; got != v1.StateRunning {
		t.Errorf("state %s, want running", got)
	}
	evs, err := f.store.Events(t.Context(), fleet.ServerKey{User: "ada", Name: "a"}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Errorf("%d events, want only the restore event: %+v", len(evs), evs)
	}
	var got [][2]string
	for _, e := range f.audit() {
		got = append(got, [2]string{e.Action, e.Inputs["dryRun"]})
	}
	want := [][2]string{{reclaim.AuditStop, "true"}, {reclaim.AuditWarn, "true"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit (newest first) (-want +got):\n%s", diff)
	}
	if f.stopper.calls != 0 {
		t.Errorf("stop calls %d, want 0", f.stopper.calls)
	}
}

func TestStartAgainGetsAFreshIdleClock(t *testing.T) {
	f := newFixture(t)
	f.policy(stopPolicy())
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", nb)
	f.run(9*time.Minute, "spawn-1", constSM(0)) // warned, 1 min before the stop
	if st := f.state("a"); st.Verdict != reclaim.VerdictIdle || st.Rung != 1 {
		t.Fatalf("before restart: %+v, want idle and warned", st)
	}
	// The user stops and starts the server again: a new spawn.
	k := fleet.ServerKey{User: "ada", Name: "a"}
	if _, err := f.stopper.Delete(t.Context(), reclaim.ActorOf, k); err != nil {
		t.Fatal(err)
	}
	if err := f.store.DeleteServer(t.Context(), k, "spawn-1"); err != nil {
		t.Fatal(err)
	}
	f.server("a", "spawn-2", nb)
	restart := f.clock.Now().Add(interval)
	f.run(9*time.Minute, "spawn-2", constSM(0))
	st := f.state("a")
	if st.SpawnID != "spawn-2" || !st.Since.Equal(restart) {
		t.Errorf("idle clock of the new spawn: %s since %s, want spawn-2 since %s", st.SpawnID, st.Since, restart)
	}
	if got := f.get("a").State; got != v1.StateRunning {
		t.Errorf("9 min after the restart: %s, want running", got)
	}
}

func TestExtendPostponesTheStopWithinTheLimit(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.MaxExtend = 30 * time.Minute
	f.policy(p)
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", nb)
	f.run(9*time.Minute, "spawn-1", constSM(0))
	st, err := f.rec.Extend(t.Context(), f.get("a"), 20*time.Minute, ada)
	if err != nil {
		t.Fatal(err)
	}
	if want := f.clock.Now().Add(20 * time.Minute); !st.ExtendedUntil.Equal(want) {
		t.Errorf("extended until %s, want %s", st.ExtendedUntil, want)
	}
	if _, err := f.rec.Extend(t.Context(), f.get("a"), 11*time.Minute, ada); err == nil || !strings.Contains(err.Error(), "at most 10 min more") {
		t.Errorf("extension past the limit: %v, want the remaining 10 min named", err)
	}
	f.run(25*time.Minute, "spawn-1", constSM(0)) // 20 min extension + 5 min: not yet 10 idle
	if got := f.get("a").State; got != v1.StateRunning {
		t.Fatalf("during the extension: %s, want running", got)
	}
	f.run(10*time.Minute, "spawn-1", constSM(0))
	if got := f.get("a").State; got != v1.StateStopped {
		t.Errorf("10 min after the extension: %s, want stopped", got)
	}
}

func TestBusyAgainRestoresCompute(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.Action, p.ShrinkComputePercent, p.Warn = reclaim.ActionShrink, 5, 0
	f.policy(p)
	nb := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", nb)
	f.run(11*time.Minute, "spawn-1", constSM(0))
	f.run(time.Minute, "spawn-1", constSM(90))
	q, err := f.agents.DesiredQuota(t.Context(), "spawn-1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(slice, q.Slice); diff != "" {
		t.Errorf("desired quota when busy again (-want +got):\n%s", diff)
	}
	var got []string
	for _, e := range f.audit() {
		got = append(got, e.Action)
	}
	if diff := cmp.Diff([]string{reclaim.AuditRestore, reclaim.AuditShrink}, got); diff != "" {
		t.Errorf("audit (-want +got):\n%s", diff)
	}
}
