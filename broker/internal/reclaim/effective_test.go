package reclaim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/api/v1/v1test"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

func TestEffective(t *testing.T) {
	base := stopPolicy()
	base.ExemptUsers = []string{"root"}
	base.ExemptGroups = []string{"vip"}
	base.Overrides = []reclaim.Override{
		{Group: "students", IdleAfterSeconds: 1800},
		{Profile: "big", Action: reclaim.ActionShrink, ShrinkComputePercent: 10, StopAfterSeconds: 7200},
		{Group: "research", Exempt: true},
	}
	type got struct {
		IdleAfter, StopAfter, MaxExtend time.Duration
		Action                          reclaim.Action
		Shrink                          int
		Exempt                          bool
	}
	tests := []struct {
		name          string
		user, profile string
		groups        []string
		want          got
	}{
		{"no override", "ada", "small", nil, got{10 * time.Minute, 0, reclaim.DefaultMaxExtend, reclaim.ActionStop, 0, false}},
		{"group override", "ada", "small", []string{"students"}, got{30 * time.Minute, 0, reclaim.DefaultMaxExtend, reclaim.ActionStop, 0, false}},
		{"a profile override wins over a group one", "ada", "big", []string{"students"}, got{10 * time.Minute, 2 * time.Hour, reclaim.DefaultMaxExtend, reclaim.ActionShrink, 10, false}},
		{"exempt user", "root", "small", nil, got{10 * time.Minute, 0, reclaim.DefaultMaxExtend, reclaim.ActionStop, 0, true}},
		{"exempt group", "ada", "small", []string{"x", "vip"}, got{10 * time.Minute, 0, reclaim.DefaultMaxExtend, reclaim.ActionStop, 0, true}},
		{"exempt override", "ada", "small", []string{"research"}, got{10 * time.Minute, 0, reclaim.DefaultMaxExtend, reclaim.ActionStop, 0, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eff, exempt := base.Effective(tc.user, tc.profile, tc.groups)
			g := got{eff.IdleAfter, eff.StopAfter, eff.MaxExtend, eff.Action, eff.ShrinkComputePercent, exempt}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if eff.Overrides != nil {
				t.Error("the effective policy keeps overrides")
			}
		})
	}
}

func TestValidateAddedFields(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(p *reclaim.Policy)
		want   []string // fields with problems
	}{
		{"valid ladder to stop", func(p *reclaim.Policy) {
			p.Action, p.ShrinkComputePercent, p.StopAfter = reclaim.ActionShrink, 5, time.Hour
		}, nil},
		{"stop after without shrink", func(p *reclaim.Policy) { p.StopAfter = time.Hour }, []string{"stopAfterSeconds"}},
		{"stop after before the shrink and its notice", func(p *reclaim.Policy) {
			p.Action, p.ShrinkComputePercent, p.StopAfter = reclaim.ActionShrink, 5, 11*time.Minute
		}, []string{"stopAfterSeconds"}},
		{"negative minimum running time", func(p *reclaim.Policy) { p.MinRunning = -time.Second }, []string{"minRunningSeconds"}},
		{"maximum age too short", func(p *reclaim.Policy) { p.MaxAge = time.Minute }, []string{"maxAgeSeconds"}},
		{"extension limit too long", func(p *reclaim.Policy) { p.MaxExtend = 8 * 24 * time.Hour }, []string{"maxExtendSeconds"}},
		{"override names neither", func(p *reclaim.Policy) { p.Overrides = []reclaim.Override{{IdleAfterSeconds: 600}} }, []string{"overrides[0]"}},
		{"override makes the policy invalid: named after the override's field", func(p *reclaim.Policy) {
			p.Overrides = []reclaim.Override{{Group: "g", Action: reclaim.ActionShrink}}
		}, []string{"overrides[0].shrinkComputePercent"}},
		{"override warning not before the inherited idle time", func(p *reclaim.Policy) {
			p.Overrides = []reclaim.Override{{Group: "g", WarnSeconds: 3600}}
		}, []string{"overrides[0].warnSeconds"}},
		{"override action unknown, reported once", func(p *reclaim.Policy) {
			p.Overrides = []reclaim.Override{{Profile: "p", Action: "explode"}}
		}, []string{"overrides[0].action"}},
		{"override negative times, each named", func(p *reclaim.Policy) {
			p.Overrides = []reclaim.Override{{Profile: "p", IdleAfterSeconds: -1, MaxAgeSeconds: -1}}
		}, []string{"overrides[0].idleAfterSeconds", "overrides[0].maxAgeSeconds"}},
		{"the policy's own problem is not repeated for its overrides", func(p *reclaim.Policy) {
			p.IdleComputePercent = 101
			p.Overrides = []reclaim.Override{{Profile: "p", IdleAfterSeconds: 1800}, {Group: "g", Exempt: true}}
		}, []string{"idleComputePercent"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := stopPolicy()
			tc.mutate(&p)
			err := p.Validate()
			var fields []string
			var ve *reclaim.ValidationError
			if errors.As(err, &ve) {
				for _, pr := range ve.Problems {
					fields = append(fields, pr.Field)
				}
			} else if err != nil {
				t.Fatalf("error %v is not a ValidationError", err)
			}
			if diff := cmp.Diff(tc.want, fields); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestPolicyFromAPIAndBackKeepsEveryField: the one converter between the
// wire document and the domain loses no field (checked by reflection).
func TestPolicyFromAPIAndBackKeepsEveryField(t *testing.T) {
	full := v1test.FullReclaimPolicy()
	if z := v1test.ZeroFields(full); len(z) != 0 {
		t.Fatalf("the fixture leaves %v zero", z)
	}
	p := reclaim.PolicyFromAPI(full)
	if err := p.Validate(); err != nil {
		t.Errorf("the fixture is not a valid policy: %v", err)
	}
	if diff := cmp.Diff(full, p.API()); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestStoredPolicyKeepsAddedFields(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.ExemptUsers, p.MinRunning, p.MaxAge, p.MaxExtend, p.DryRun = []string{"root"}, 5*time.Minute, 48*time.Hour, time.Hour, true
	p.Overrides = []reclaim.Override{{Group: "students", IdleAfterSeconds: 1800}}
	saved := f.policy(p)
	got, err := f.policies.Get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(saved, got); diff != "" {
		t.Errorf("stored policy (-want +got):\n%s", diff)
	}
}

func TestMinimumRunningTimeAndMaximumAge(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.MinRunning, p.MaxAge, p.Warn = 20*time.Minute, time.Hour, 5*time.Minute
	f.policy(p)
	idle := newNotebook(t, t0.Add(-time.Hour))
	f.server("a", "spawn-1", idle)
	f.run(25*time.Minute, "spawn-1", constSM(0)) // idle clock starts at 20 min; stop at 30 min
	if st := f.state("a"); f.get("a").State != v1.StateRunning || st.Verdict != reclaim.VerdictIdle {
		t.Fatalf("25 min after start: %s %+v, want running and idle", f.get("a").State, st)
	}
	f.run(10*time.Minute, "spawn-1", constSM(0))
	if got := f.get("a").State; got != v1.StateStopped {
		t.Fatalf("35 min after start (15 idle): %s, want stopped", got)
	}

	// A busy server is stopped at the maximum age, after notice.
	busy := newNotebook(t, t0)
	start := f.clock.Now()
	f.server("b", "spawn-2", busy)
	f.run(54*time.Minute, "spawn-2", constSM(90))
	if got := f.get("b").State; got != v1.StateRunning {
		t.Fatalf("54 min old: %s, want running", got)
	}
	f.run(7*time.Minute, "spawn-2", constSM(90))
	if got := f.get("b").State; got != v1.StateStopped {
		t.Fatalf("61 min old: %s, want stopped", got)
	}
	var got []string
	for _, e := range f.audit() {
		if e.Target == "server:ada/b" {
			got = append(got, e.Action+" "+e.Time.Sub(start).String())
		}
	}
	if diff := cmp.Diff([]string{reclaim.AuditStop + " 1h0m0s", reclaim.AuditWarn + " 55m0s"}, got); diff != "" {
		t.Errorf("max-age audit (-want +got):\n%s", diff)
	}
}
