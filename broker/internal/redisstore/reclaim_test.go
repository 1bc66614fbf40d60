package redisstore

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/api/v1/v1test"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// reclaimEnv is the reclaim policy and the audit log over one prefix.
type reclaimEnv struct {
	*reclaim.Policies
	*AuditLog
}

func newReclaimEnv(t *testing.T, rdb redis.UniversalClient, prefix string) reclaimEnv {
	t.Helper()
	clk := newFakeClock()
	return reclaimEnv{reclaim.NewPolicies(NewReclaim(rdb, prefix), clk.Now, nil), NewAuditLog(rdb, prefix, nil)}
}

func validCursor(s string) bool { _, ok := audit.ParseCursor(s); return ok }

func TestAuditFilterAndPages(t *testing.T) {
	srv := redistest.Start(t)
	s := newReclaimEnv(t, srv.Client(t), srv.Prefix(t))
	ctx := t.Context()
	for i := range 5 {
		p, err := s.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.IdleComputePercent = i + 10
		actor := "alice"
		if i%2 == 1 {
			actor = "bob"
		}
		if _, err := s.Put(ctx, p, actor); err != nil {
			t.Fatal(err)
		}
	}
	versions := func(es []audit.Entry) []int64 {
		var v []int64
		for _, e := range es {
			v = append(v, e.PolicyVersion)
		}
		return v
	}
	page1, next, err := s.Audit(ctx, audit.Query{Actor: "ALICE", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	page2, next2, err := s.Audit(ctx, audit.Query{Actor: "alice", Limit: 2, Before: next})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]int64{{5, 3}, {1}}, [][]int64{versions(page1), versions(page2)}); diff != "" || next2 != "" || !validCursor(next) {
		t.Errorf("pages (-want +got):\n%s next %q next2 %q", diff, next, next2)
	}
	if none, _, err := s.Audit(ctx, audit.Query{Action: "server.stop"}); err != nil || len(none) != 0 {
		t.Errorf("filter by another action: %v %v", none, err)
	}
}

// TestReclaimOnMiniredis: dev mode's embedded Redis runs the same scripts
// (the policy save and the extension).
func TestReclaimOnMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	s := newReclaimEnv(t, rdb, "dev:")
	p := reclaim.DefaultPolicy()
	p.Enabled = true
	if _, err := s.Put(t.Context(), p, "dev"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(t.Context(), p, "dev"); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("stale put on miniredis: %v", err)
	}
	if es, _, err := s.Audit(t.Context(), audit.Query{}); err != nil || len(es) != 1 {
		t.Errorf("audit on miniredis: %v %v", es, err)
	}
	ext, err := NewReclaim(rdb, "dev:").ExtendIdle(t.Context(), "sp1", time.UnixMilli(1000), time.Minute, time.Hour)
	if err != nil || !ext.Granted || !ext.Until.Equal(time.UnixMilli(61000)) || ext.Total != time.Minute {
		t.Errorf("extend on miniredis: %+v %v", ext, err)
	}
}

// TestStoredPolicyKeepsEveryField saves a policy that sets every field of
// the wire type (checked by reflection) and reads the same back.
func TestStoredPolicyKeepsEveryField(t *testing.T) {
	full := v1test.FullReclaimPolicy()
	if z := v1test.ZeroFields(full); len(z) != 0 {
		t.Fatalf("the fixture leaves %v zero", z)
	}
	srv := redistest.Start(t)
	r := NewReclaim(srv.Client(t), srv.Prefix(t))
	p := reclaim.PolicyFromAPI(full)
	p.Version = 1
	if saved, err := r.SavePolicy(t.Context(), p, audit.Entry{Action: "test"}); err != nil || !saved {
		t.Fatalf("save: %v %v", saved, err)
	}
	got, ok, err := r.Policy(t.Context())
	if err != nil || !ok {
		t.Fatalf("policy: %v %v", ok, err)
	}
	want := full
	want.Version = 1
	if diff := cmp.Diff(want, got.API()); diff != "" {
		t.Errorf("stored policy (-want +got):\n%s", diff)
	}
	hist, err := r.PolicyHistory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, hist[1].API()); diff != "" {
		t.Errorf("policy history's version 1 (-want +got):\n%s", diff)
	}
}

// TestSaveIdleStatesKeepsTheExtension: a cycle's save after an extension
// was granted leaves the extension as the script wrote it.
func TestSaveIdleStatesKeepsTheExtension(t *testing.T) {
	srv := redistest.Start(t)
	r := NewReclaim(srv.Client(t), srv.Prefix(t))
	ctx := t.Context()
	now := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	before, err := r.IdleStates(ctx, []string{"sp1", "sp2"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]reclaim.IdleState{{SpawnID: "sp1"}, {SpawnID: "sp2"}}, before); diff != "" {
		t.Fatalf("states never saved (-want +got):\n%s", diff)
	}
	ext, err := r.ExtendIdle(ctx, "sp1", now, 20*time.Minute, time.Hour)
	if err != nil || !ext.Granted {
		t.Fatalf("extend: %+v %v", ext, err)
	}
	st := reclaim.IdleState{SpawnID: "sp1", Verdict: reclaim.VerdictIdle, Since: now.Add(-time.Hour), FirstSeen: now.Add(-2 * time.Hour),
		CheckedAt: now, Rung: 1, WarnedAt: now.Add(-time.Minute), ShrunkFrom: 40, ShrunkLimitFrom: 100, Exempt: true}
	if err := r.SaveIdleStates(ctx, []reclaim.IdleState{st}); err != nil {
		t.Fatal(err)
	}
	got, err := r.IdleStates(ctx, []string{"sp1"})
	if err != nil {
		t.Fatal(err)
	}
	want := st
	want.ExtendedUntil, want.Extended = now.Add(20*time.Minute), 20*time.Minute
	if diff := cmp.Diff([]reclaim.IdleState{want}, got); diff != "" {
		t.Errorf("state after extend and save (-want +got):\n%s", diff)
	}
	if ttl := srv.Client(t).PTTL(ctx, r.k.IdleState("sp1")).Val(); ttl <= 0 || ttl > IdleStateTTL {
		t.Errorf("idle state TTL %s, want up to %s", ttl, IdleStateTTL)
	}
	if ext, err := r.ExtendIdle(ctx, "sp1", now, 41*time.Minute, time.Hour); err != nil || ext.Granted || ext.Total != 20*time.Minute {
		t.Errorf("extension past the limit: %+v %v, want refused with 20 min granted so far", ext, err)
	}
}

// TestAgentSamplesKeepWhatReclaimJudges reads the agents' samples through
// agentstore (the contract's one reader) and keeps the fields the
// reclaimer judges by, with the agent contract's staleness rule.
func TestAgentSamplesKeepWhatReclaimJudges(t *testing.T) {
	srv := redistest.Start(t)
	agents := agentstore.New(srv.Client(t), srv.Prefix(t))
	t0 := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	sm, mem := 37, int64(2048)
	kernel := t0.Add(-time.Second)
	in := []agentstore.Sample{
		{Slice: "s1", At: t0, Interval: 10 * time.Second, SMPercent: &sm, MemoryUsedMiB: &mem, LastKernel: &kernel},
		{Slice: "s1", At: t0.Add(10 * time.Second), Interval: 10 * time.Second, Missing: "gpu lost"},
	}
	if err := agents.AddSamples(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	raw, err := agents.RecentSamples(t.Context(), "s1", 10)
	if err != nil || len(raw) != 2 {
		t.Fatalf("agentstore samples: %v %v", raw, err)
	}
	got, err := AgentSamples{Agents: agents}.RecentSamples(t.Context(), []string{"s1", "none"}, 10, t0.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := [][]reclaim.Sample{{
		{ID: raw[0].ID, At: t0.Add(10 * time.Second), FreshUntil: t0.Add(40 * time.Second), Missing: "gpu lost"},
		{ID: raw[1].ID, At: t0, FreshUntil: t0.Add(30 * time.Second), SMPercent: &sm, LastKernel: &kernel},
	}, nil}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	for _, at := range []time.Time{t0.Add(40 * time.Second), t0.Add(40*time.Second + time.Millisecond)} {
		if got[0][0].Stale(at) != raw[0].Stale(at) {
			t.Errorf("at %s: stale %v, the agent contract says %v", at, got[0][0].Stale(at), raw[0].Stale(at))
		}
	}
}

// TestAuditMergesTheAgentsRecords: the broker's entries and the node
// agents' enforcement records come back as one log, newest first by stream
// id (the broker's first on equal ids), each source filterable; paging
// with the cursor returns every entry exactly once, also across entries
// that share an id.
func TestAuditMergesTheAgentsRecords(t *testing.T) {
	srv := redistest.Start(t)
	rdb, prefix := srv.Client(t), srv.Prefix(t)
	agents := agentstore.New(rdb, prefix)
	log := NewAuditLog(rdb, prefix, agents)
	k := redisschema.New(prefix)
	ctx := t.Context()
	at := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	broker := func(id, action string) {
		b, err := json.Marshal(audit.Entry{Time: at, Source: v1.AuditSourceReclaim, Actor: "reclaimer", ActorKind: v1.ActorReclaimer, Action: action, Target: "server:ada/a"})
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: k.Audit(), ID: id, Values: []any{"entry", string(b)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	agent := func(id, action string, pid uint32) {
		r := agentstore.AuditRecord{At: at, Node: "n1", Action: action, Reason: "over-memory", Policy: "kill tolerance=5% samples=3",
			Slice: "sp1", Pod: "nb-ada", Namespace: "notebooks", PID: pid, GPU: "GPU-1", MemoryUsedMiB: 9000, MemoryLimitMiB: 8192, Samples: 3}
		if action != "kill-failed" { // an agent from before records named the server
			r.User, r.Server = "ada", "a"
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: k.AgentAudit(), ID: id, Values: []any{"r", string(b)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	broker("100-0", "reclaim.warn")
	agent("100-0", "report", 7) // the same id as the broker's warning
	agent("150-0", "kill", 7)
	broker("200-0", "reclaim.stop")
	agent("300-0", "kill-failed", 8)

	type got struct{ ID, Source, Action string }
	page := func(q audit.Query) ([]got, string) {
		t.Helper()
		es, next, err := log.Audit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []got
		for _, e := range es {
			out = append(out, got{e.ID, e.Source, e.Action})
		}
		return out, next
	}
	all := []got{{"300-0", "agent", "agent.kill-failed"}, {"200-0", "reclaim", "reclaim.stop"}, {"150-0", "agent", "agent.kill"},
		{"100-0", "reclaim", "reclaim.warn"}, {"100-0", "agent", "agent.report"}}
	first, next := page(audit.Query{})
	if diff := cmp.Diff(all, first); diff != "" || next != "" {
		t.Errorf("one page (-want +got):\n%s next %q", diff, next)
	}
	var paged []got
	q := audit.Query{Limit: 1}
	for range 10 {
		p, next := page(q)
		paged = append(paged, p...)
		if next == "" {
			break
		}
		q.Before = next
	}
	if diff := cmp.Diff(all, paged); diff != "" {
		t.Errorf("pages of one (-want +got):\n%s", diff)
	}
	agentsOnly, _ := page(audit.Query{Source: v1.AuditSourceAgent})
	reclaimOnly, _ := page(audit.Query{Source: v1.AuditSourceReclaim})
	if diff := cmp.Diff([][]got{{all[0], all[2], all[4]}, {all[1], all[3]}}, [][]got{agentsOnly, reclaimOnly}); diff != "" {
		t.Errorf("by source (-want +got):\n%s", diff)
	}

	es, _, err := log.Audit(ctx, audit.Query{Action: "agent.kill"})
	if err != nil || len(es) != 1 {
		t.Fatalf("the kill: %v %v", es, err)
	}
	want := audit.Entry{ID: "150-0", Time: at, Source: v1.AuditSourceAgent, Actor: "gpubroker-agent@n1", ActorKind: v1.ActorAgent,
		Action: "agent.kill", Target: "server:ada/a", Reason: "over-memory", Inputs: map[string]string{
			"policy": "kill tolerance=5% samples=3", "slice": "sp1", "pod": "notebooks/nb-ada", "gpu": "GPU-1", "pid": "7", "memoryUsedMiB": "9000",
			"memoryLimitMiB": "8192", "samples": "3"}}
	if diff := cmp.Diff(want, es[0]); diff != "" {
		t.Errorf("an agent's record as an entry (-want +got):\n%s", diff)
	}
	// Filtering by the server finds the broker's and the agents' entries
	// about it; a record that names only its pod keeps the pod as target.
	byServer, _ := page(audit.Query{User: "ada", Server: "a"})
	byUser, _ := page(audit.Query{User: "ada"})
	if diff := cmp.Diff([][]got{{all[1], all[2], all[3], all[4]}, {all[1], all[2], all[3], all[4]}}, [][]got{byServer, byUser}); diff != "" {
		t.Errorf("by server and by user (-want +got):\n%s", diff)
	}
	if old, _, _ := log.Audit(ctx, audit.Query{Action: "agent.kill-failed"}); len(old) != 1 || old[0].Target != "pod:notebooks/nb-ada" {
		t.Errorf("a record without the server's names: %+v, want its pod as target", old)
	}
}

// TestAnOverComputeRecordShowsItsFigures: the agent's over-compute record
// is read in the admin audit with the slice's SM use and its ceiling next
// to the policy, and a memory record gains no compute inputs.
func TestAnOverComputeRecordShowsItsFigures(t *testing.T) {
	r := agentstore.AuditRecord{Node: "n1", Action: agentstore.ActionReport, Reason: agentstore.ReasonOverCompute, Policy: "kill tolerance=5% compute=report compute-tolerance=10 samples=3 orphan-grace=30s",
		Slice: "sp1", Pod: "nb-ada", Namespace: "notebooks", User: "ada", Server: "a", PID: 7, GPU: "GPU-1", MemoryUsedMiB: 900, MemoryLimitMiB: 8192,
		SMPercent: 75, ComputeLimitPercent: 30, Samples: 10}
	e := agentEntry(r)
	if e.Inputs["smPercent"] != "75" || e.Inputs["computeLimitPercent"] != "30" || e.Reason != "over-compute" || e.Target != "server:ada/a" {
		t.Errorf("over-compute entry %+v, want smPercent 75 and computeLimitPercent 30 on server:ada/a", e)
	}
	r.Reason, r.SMPercent, r.ComputeLimitPercent = agentstore.ReasonOverMemory, 0, 0
	if e := agentEntry(r); e.Inputs["smPercent"] != "" || e.Inputs["computeLimitPercent"] != "" {
		t.Errorf("over-memory entry %+v has compute inputs", e.Inputs)
	}
}
