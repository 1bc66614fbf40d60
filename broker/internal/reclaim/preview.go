package reclaim

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// PreviewAction is one action a cycle would take on a server.
type PreviewAction struct {
	// Action is warn, shrink, restore or stop, or notice for an event
	// without an action (the idle countdown is cancelled).
	Action string
	// Message is the event the server's user would see.
	Message string
}

// PreviewServer is what one cycle would do to one running server.
type PreviewServer struct {
	Server fleet.Server
	// State is the idle state after the cycle, with its next step
	// (NextAction, NextAt) if the server stays idle.
	State IdleState
	// Actions are the actions due now, in order; none when nothing happens.
	Actions []PreviewAction
}

// Preview returns what the next cycle would do to every running server,
// sorted by user and name, if pol were saved now with reclaiming on and no
// dry run: the same observations as a cycle (samples, idle states,
// notebook probes) and the same decision (decide), but nothing is carried
// out, audited or stored. The caller says what pol.Enabled false or
// pol.DryRun true would change (nothing would reach the servers). Errors:
// *ValidationError (fleet.ErrInvalid) for an invalid pol, else the
// observations' errors.
func (r *Reclaimer) Preview(ctx context.Context, pol Policy) ([]PreviewServer, error) {
	pol = pol.Normalize()
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	acting := pol
	acting.Enabled, acting.DryRun = true, false
	now := r.now().UTC()
	o, err := r.observe(ctx, acting, now)
	if err != nil {
		return nil, err
	}
	out := make([]PreviewServer, len(o.run))
	for i, s := range o.run {
		next, acts := decide(now, s, acting, o.effs[i], o.exempt[i], o.obs[i], o.states[i])
		next.NextAction, next.NextAt = nextStep(next, acting, o.effs[i], o.exempt[i])
		ps := PreviewServer{Server: s, State: next}
		for _, a := range acts {
			name := strings.TrimPrefix(a.audit, "reclaim.")
			if a.audit == "" {
				name = "notice"
			}
			ps.Actions = append(ps.Actions, PreviewAction{Action: name, Message: a.message})
		}
		out[i] = ps
	}
	slices.SortFunc(out, func(a, b PreviewServer) int {
		return cmp.Or(strings.Compare(a.Server.User, b.Server.User), strings.Compare(a.Server.Name, b.Server.Name))
	})
	return out, nil
}
