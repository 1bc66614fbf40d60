package reclaim_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}

var t0 = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)

// policyEnv is the policy (Get, Put) over a real Redis and the audit log
// (Audit) its saves write to.
type policyEnv struct {
	*reclaim.Policies
	*redisstore.AuditLog
}

// newStore returns the policy over a real redis-server under a prefix of
// its own, with a clock that moves a minute each time it is read.
func newStore(t *testing.T) policyEnv {
	t.Helper()
	rs := redistest.Start(t)
	now := t0
	var mu sync.Mutex
	rdb, prefix := rs.Client(t), rs.Prefix(t)
	return policyEnv{reclaim.NewPolicies(redisstore.NewReclaim(rdb, prefix), func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Minute)
		return now
	}, nil), redisstore.NewAuditLog(rdb, prefix, nil)}
}

func TestValidate(t *testing.T) {
	ok := reclaim.DefaultPolicy()
	tests := []struct {
		name   string
		change func(*reclaim.Policy)
		want   []string // invalid fields
	}{
		{"default is valid", func(*reclaim.Policy) {}, nil},
		{"shrink with a target", func(p *reclaim.Policy) { p.Action, p.ShrinkComputePercent = reclaim.ActionShrink, 5 }, nil},
		{"idle percent out of range", func(p *reclaim.Policy) { p.IdleComputePercent = 101 }, []string{"idleComputePercent"}},
		{"idle time too short", func(p *reclaim.Policy) { p.IdleAfter = 59 * time.Second }, []string{"idleAfterSeconds"}},
		{"idle time too long", func(p *reclaim.Policy) { p.IdleAfter = 8 * 24 * time.Hour }, []string{"idleAfterSeconds"}},
		{"unknown action", func(p *reclaim.Policy) { p.Action = "delete" }, []string{"action"}},
		{"shrink without target", func(p *reclaim.Policy) { p.Action = reclaim.ActionShrink }, []string{"shrinkComputePercent"}},
		{"target without shrink", func(p *reclaim.Policy) { p.ShrinkComputePercent = 10 }, []string{"shrinkComputePercent"}},
		{"warning not before the action", func(p *reclaim.Policy) { p.Warn = p.IdleAfter }, []string{"warnSeconds"}},
		{"negative warning", func(p *reclaim.Policy) { p.Warn = -time.Second }, []string{"warnSeconds"}},
		{"several at once", func(p *reclaim.Policy) { p.IdleComputePercent, p.Action = -1, "" }, []string{"idleComputePercent", "action"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.change(&p)
			err := p.Validate()
			var got []string
			var ve *reclaim.ValidationError
			if errors.As(err, &ve) {
				for _, pr := range ve.Problems {
					got = append(got, pr.Field)
				}
				if !errors.Is(err, fleet.ErrInvalid) {
					t.Error("validation error does not match fleet.ErrInvalid")
				}
			} else if err != nil {
				t.Fatalf("err %v is not a *ValidationError", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("invalid fields (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPutGetAndAudit(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	got, err := s.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(reclaim.DefaultPolicy(), got); diff != "" {
		t.Fatalf("initial policy (-want +got):\n%s", diff)
	}
	p := got
	p.Enabled, p.Action, p.ShrinkComputePercent = true, reclaim.ActionShrink, 10
	p.ExemptGroups = []string{" ml ", "admins", "ml"}
	p.Reason = "  night shift  "
	saved, err := s.Put(ctx, p, "root")
	if err != nil {
		t.Fatal(err)
	}
	want := p
	want.Version, want.UpdatedBy, want.UpdatedAt = 1, "root", t0.Add(time.Minute)
	want.ExemptGroups, want.Reason = []string{"admins", "ml"}, "night shift"
	if diff := cmp.Diff(want, saved); diff != "" {
		t.Errorf("saved (-want +got):\n%s", diff)
	}
	if back, err := s.Get(ctx); err != nil || !cmp.Equal(want, back) {
		t.Errorf("get after put (-want +got):\n%s (err %v)", cmp.Diff(want, back), err)
	}
	entries, next, err := s.Audit(ctx, audit.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || next != "" {
		t.Fatalf("audit = %+v next %q, want one entry", entries, next)
	}
	e := entries[0]
	e.ID = ""
	if diff := cmp.Diff(audit.Entry{
		Time: t0.Add(time.Minute), Source: v1.AuditSourceReclaim, Actor: "root", ActorKind: v1.ActorAdmin, Action: reclaim.AuditPolicyUpdate, Target: reclaim.AuditTargetPolicy,
		Reason: "night shift", PolicyVersion: 1,
		Inputs: map[string]string{"enabled": "false → true", "action": "warn → shrink", "shrinkComputePercent": "0 → 10", "exemptGroups": "[] → [admins, ml]"},
	}, e); diff != "" {
		t.Errorf("audit entry (-want +got):\n%s", diff)
	}
}

func TestInvalidPutSavesNothing(t *testing.T) {
	s := newStore(t)
	p := reclaim.DefaultPolicy()
	p.IdleComputePercent = 500
	if _, err := s.Put(t.Context(), p, "root"); !errors.Is(err, fleet.ErrInvalid) {
		t.Fatalf("put invalid: err %v, want invalid", err)
	}
	got, err := s.Get(t.Context())
	if err != nil || got.Version != 0 {
		t.Errorf("after invalid put: version %d err %v, want 0", got.Version, err)
	}
	if entries, _, err := s.Audit(t.Context(), audit.Query{}); err != nil || len(entries) != 0 {
		t.Errorf("audit after invalid put: %v %v, want none", entries, err)
	}
}

func TestConflictSaysWhoChangedWhat(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	base := reclaim.DefaultPolicy()
	bob := base
	bob.Action = reclaim.ActionStop
	if _, err := s.Put(ctx, bob, "bob"); err != nil {
		t.Fatal(err)
	}
	alice := base // still version 0
	alice.IdleComputePercent = 10
	_, err := s.Put(ctx, alice, "alice")
	var ce *reclaim.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, fleet.ErrConflict) {
		t.Fatalf("stale put: err %v, want a ConflictError", err)
	}
	msg := err.Error()
	for _, want := range []string{"version 1 by bob at 2026-11-29 15:01 UTC", "action warn → stop", "started from version 0"} {
		if !strings.Contains(msg, want) {
			t.Errorf("conflict message %q lacks %q", msg, want)
		}
	}
	future := base
	future.Version = 9
	if _, err := s.Put(ctx, future, "alice"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("put from a future version: %v", err)
	}
}

// TestConcurrentPutsOneWins: n admins save from the same version; exactly
// one version is saved and audited.
func TestConcurrentPutsOneWins(t *testing.T) {
	s := newStore(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			p := reclaim.DefaultPolicy()
			p.IdleComputePercent = i + 1
			_, errs[i] = s.Put(t.Context(), p, fmt.Sprintf("admin%d", i))
		})
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, fleet.ErrConflict):
			t.Errorf("unexpected error %v", err)
		}
	}
	entries, _, err := s.Audit(t.Context(), audit.Query{})
	if wins != 1 || err != nil || len(entries) != 1 {
		t.Errorf("%d saves, %d audit entries (err %v), want 1 and 1", wins, len(entries), err)
	}
}

// TestLostPolicyFallsBackToTheDefaultSaying: when the store loses the
// saved policy (a Redis FLUSHALL), Get answers the defaults with source
// "default", and the broker logs one warning naming the version lost, not
// one per read; a policy saved again is "stored" and a later loss warns
// again.
func TestLostPolicyFallsBackToTheDefaultSaying(t *testing.T) {
	rs := redistest.Start(t)
	rdb, prefix := rs.Client(t), rs.Prefix(t)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	ps := reclaim.NewPolicies(redisstore.NewReclaim(rdb, prefix), func() time.Time { return t0 }, log)
	ctx := t.Context()
	get := func() v1.ReclaimPolicy {
		t.Helper()
		p, err := ps.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.API()
	}
	if p := get(); p.Source != v1.ReclaimPolicyDefault || p.Version != 0 {
		t.Errorf("before any save: version %d source %q, want 0 and default", p.Version, p.Source)
	}
	saved, err := ps.Put(ctx, reclaim.DefaultPolicy(), "root")
	if err != nil {
		t.Fatal(err)
	}
	if p := get(); p.Source != v1.ReclaimPolicyStored || p.Version != saved.Version {
		t.Errorf("after a save: version %d source %q, want %d and stored", p.Version, p.Source, saved.Version)
	}
	lose := func() {
		t.Helper()
		keys, err := rdb.Keys(ctx, prefix+"*").Result()
		if err != nil || len(keys) == 0 {
			t.Fatalf("keys under %q: %v %v", prefix, keys, err)
		}
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	logged := func() string {
		mu.Lock()
		defer mu.Unlock()
		return logs.String()
	}
	warnings := func() int { return strings.Count(logged(), "the stored reclaim policy is gone") }
	lose()
	for range 3 {
		if p := get(); p.Source != v1.ReclaimPolicyDefault || p.Version != 0 {
			t.Errorf("after the store lost it: version %d source %q, want 0 and default", p.Version, p.Source)
		}
	}
	if n := warnings(); n != 1 || !strings.Contains(logged(), "lost_version=1") {
		t.Errorf("%d warnings, want 1 naming version 1:\n%s", n, logged())
	}
	if _, err := ps.Put(ctx, reclaim.DefaultPolicy(), "root"); err != nil {
		t.Fatal(err)
	}
	get()
	lose()
	get()
	if n := warnings(); n != 2 {
		t.Errorf("%d warnings after a second loss, want 2", n)
	}
}

// lockedWriter is an io.Writer safe for concurrent use.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
