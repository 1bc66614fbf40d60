package reclaim

import (
	"fmt"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// act is one action decided for one server.
type act struct {
	audit   string // AuditWarn...; "" for an event without audit
	message string
	// why classifies the action for metrics: whyIdle, whyMaxAge or whyInUse.
	why string
	// compute and limit for shrink and restore.
	compute, limit int
	stop           bool
}

// decide computes a server's next state and the actions due, from the
// top-level policy pol (enabled, dry-run, version), the effective policy
// eff, the observation and the previous state (the zero state, with
// SpawnID, for a spawn not seen before). It is pure: the cycle carries the
// actions out, the preview only lists them.
func decide(now time.Time, s fleet.Server, pol, eff Policy, exempt bool, ob observation, prev IdleState) (IdleState, []act) {
	next := prev
	next.SpawnID, next.Exempt = s.SpawnID, exempt
	if next.FirstSeen.IsZero() {
		next.FirstSeen = now
	}
	if ob.verdict == VerdictIdle && eff.MinRunning > 0 && now.Before(next.FirstSeen.Add(eff.MinRunning)) {
		ob.verdict, ob.reason = VerdictActive, reasonMinRunning
	}
	if ob.verdict != prev.Verdict || ob.reason != prev.Reason { // a new spawn has no verdict yet
		next.Since = now
	}
	next.Verdict, next.Reason = ob.verdict, ob.reason
	acting := pol.Enabled && !exempt
	var acts []act
	extended := now.Before(prev.ExtendedUntil)

	if ob.verdict != VerdictIdle || extended || !acting {
		if acting && ob.verdict == VerdictActive && !prev.WarnedAt.IsZero() && !pol.DryRun {
			acts = append(acts, act{message: "in use again (" + ob.reason + "); the idle countdown is cancelled"})
		}
		if prev.ShrunkFrom > 0 {
			acts = append(acts, act{audit: AuditRestore, why: whyInUse, compute: prev.ShrunkFrom, limit: prev.ShrunkLimitFrom,
				message: fmt.Sprintf("compute restored to %d %% of the GPU", prev.ShrunkFrom)})
			next.ShrunkFrom, next.ShrunkLimitFrom = 0, 0
		}
		next.Rung, next.WarnedAt = 0, time.Time{}
	}
	if !acting {
		return next, acts
	}

	// Maximum age: independent of activity.
	if eff.MaxAge > 0 {
		age := now.Sub(s.CreatedAt)
		switch {
		case age >= eff.MaxAge && (eff.Warn == 0 || (!prev.AgeWarnedAt.IsZero() && !now.Before(prev.AgeWarnedAt.Add(eff.Warn)))):
			return next, append(acts, act{audit: AuditStop, why: whyMaxAge, stop: true,
				message: fmt.Sprintf("running for %s, the maximum is %s; stopping the server (your files are kept)", durationText(age), durationText(eff.MaxAge))})
		case prev.AgeWarnedAt.IsZero() && eff.Warn > 0 && age >= eff.MaxAge-eff.Warn:
			at := maxTime(s.CreatedAt.Add(eff.MaxAge), now.Add(eff.Warn))
			next.AgeWarnedAt = now
			acts = append(acts, act{audit: AuditWarn, why: whyMaxAge,
				message: fmt.Sprintf("running for %s; will stop at %s, the maximum running time is %s (your files are kept)", durationText(age), clockText(at, now), durationText(eff.MaxAge))})
		}
	}
	if ob.verdict != VerdictIdle || extended {
		return next, acts
	}

	base := maxTime(next.Since, prev.ExtendedUntil)
	idle := now.Sub(base)
	rungs := ladder(eff)
	if next.Rung >= len(rungs) {
		return next, acts
	}
	rg := rungs[next.Rung]
	if idle < rg.At {
		return next, acts
	}
	if next.Rung > 0 && rungs[next.Rung-1].Action == ActionWarn && !next.WarnedAt.IsZero() && now.Before(next.WarnedAt.Add(eff.Warn)) {
		return next, acts // the warning's notice has not run out yet
	}
	next.Rung++
	switch rg.Action {
	case ActionWarn:
		at := maxTime(base.Add(rg.NextAt), now.Add(eff.Warn))
		next.WarnedAt = now
		acts = append(acts, act{audit: AuditWarn, why: whyIdle, message: warnText(idle, rg.Next, at, eff.ShrinkComputePercent, now)})
	case ActionShrink:
		next.WarnedAt = time.Time{}
		if s.Slice.ComputePercent <= eff.ShrinkComputePercent || next.ShrunkFrom > 0 {
			return next, acts // nothing to shrink
		}
		next.ShrunkFrom, next.ShrunkLimitFrom = s.Slice.ComputePercent, s.Slice.ComputeLimitPercent
		msg := fmt.Sprintf("idle for %s; compute shrunk to %d %% of the GPU until the server is busy again", durationText(idle), eff.ShrinkComputePercent)
		acts = append(acts, act{audit: AuditShrink, why: whyIdle, compute: eff.ShrinkComputePercent, limit: eff.ShrinkComputePercent, message: msg})
	case ActionStop:
		acts = append(acts, act{audit: AuditStop, why: whyIdle, stop: true,
			message: fmt.Sprintf("idle for %s; stopping the server (your files are kept)", durationText(idle))})
	}
	return next, acts
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// target is the audit target of a server.
func target(s fleet.Server) string { return "server:" + s.User + "/" + s.Name }

// nextStep is the ladder's next step for a server in state st when it
// stays idle: the action (warn only when it is the last rung, else the
// action it announces) and when it would come; none when reclaiming is off
// for the server or it is not idle.
func nextStep(st IdleState, pol, eff Policy, exempt bool) (Action, time.Time) {
	if !pol.Enabled || exempt || st.Verdict != VerdictIdle {
		return "", time.Time{}
	}
	rungs := ladder(eff)
	for i := st.Rung; i < len(rungs); i++ {
		if rungs[i].Action == ActionWarn && rungs[i].Next != "" {
			continue // report the action itself, not its warning
		}
		at := maxTime(st.Since, st.ExtendedUntil).Add(rungs[i].At)
		if !st.WarnedAt.IsZero() {
			at = maxTime(at, st.WarnedAt.Add(eff.Warn))
		}
		return rungs[i].Action, at
	}
	return "", time.Time{}
}
