package reclaim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// TestPreviewListsWhatACycleWouldDoUnderTheEditedPolicy: with reclaiming
// off, three servers run for 12 minutes (one idle, one busy, one of an
// exempt group under the edited policy). The preview of a stop policy
// lists, per server, what the next cycle would do, and changes nothing.
func TestPreviewListsWhatACycleWouldDoUnderTheEditedPolicy(t *testing.T) {
	f := newFixture(t)
	f.policy(reclaim.DefaultPolicy()) // reclaiming off: the cycle only watches
	idle := newNotebook(t, t0.Add(-time.Hour))
	f.server("a-idle", "spawn-a", idle)
	f.server("b-busy", "spawn-b", idle)
	f.server("c-vip", "spawn-c", idle, "vip")
	for end := f.clock.Now().Add(12 * time.Minute); f.clock.Now().Before(end); {
		f.clock.Add(interval)
		f.sample("spawn-a", 0)
		f.sample("spawn-b", 90)
		f.sample("spawn-c", 0)
		if _, err := f.rec.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	before := f.state("a-idle")
	events := func() int {
		evs, err := f.store.Events(t.Context(), fleet.ServerKey{User: "ada", Name: "a-idle"}, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	nEvents := events()

	edited := stopPolicy() // idle 10 min, 2 min warning, stop
	edited.ExemptGroups = []string{"vip"}
	got, err := f.rec.Preview(t.Context(), edited)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name       string
		Verdict    reclaim.Verdict
		Exempt     bool
		Actions    []reclaim.PreviewAction
		NextAction reclaim.Action
		NextAt     time.Time
	}
	var rows []row
	for _, p := range got {
		rows = append(rows, row{p.Server.Name, p.State.Verdict, p.State.Exempt, p.Actions, p.State.NextAction, p.State.NextAt})
	}
	now := f.clock.Now()
	want := []row{
		{Name: "a-idle", Verdict: reclaim.VerdictIdle, Actions: []reclaim.PreviewAction{{Action: "warn",
			Message: "idle for 11 min 30 s; will stop at 15:14 UTC unless extended (your files are kept)"}},
			NextAction: reclaim.ActionStop, NextAt: now.Add(2 * time.Minute)},
		{Name: "b-busy", Verdict: reclaim.VerdictActive},
		{Name: "c-vip", Verdict: reclaim.VerdictIdle, Exempt: true},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("preview (-want +got):\n%s", diff)
	}
	if got[1].State.Reason != "the GPU is busy" {
		t.Errorf("busy server's reason %q", got[1].State.Reason)
	}

	// Nothing happened: no event, no audit record, the same idle state.
	if n := events(); n != nEvents {
		t.Errorf("%d events after the preview, want %d", n, nEvents)
	}
	if es := f.audit(); len(es) != 0 {
		t.Errorf("audit after the preview: %+v", es)
	}
	if diff := cmp.Diff(before, f.state("a-idle")); diff != "" {
		t.Errorf("idle state changed by the preview (-before +after):\n%s", diff)
	}
	if s := f.get("a-idle"); s.State != v1.StateRunning {
		t.Errorf("server %s after the preview", s.State)
	}
}

func TestPreviewRefusesAnInvalidPolicy(t *testing.T) {
	f := newFixture(t)
	p := stopPolicy()
	p.IdleComputePercent = 101
	_, err := f.rec.Preview(t.Context(), p)
	var ve *reclaim.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, fleet.ErrInvalid) || ve.Problems[0].Field != "idleComputePercent" {
		t.Errorf("preview of an invalid policy: %v", err)
	}
}
