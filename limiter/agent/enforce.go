package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// Mode is what the agent does about a process that bypasses its slice.
type Mode string

// Enforcement modes.
const (
	// ModeReport writes an audit record and a log line; the default.
	ModeReport Mode = "report"
	// ModeKill also kills the process with SIGKILL.
	ModeKill Mode = "kill"
	// ModeOff does nothing.
	ModeOff Mode = "off"
)

// Valid reports whether m is a known mode.
func (m Mode) Valid() bool { return m == ModeReport || m == ModeKill || m == ModeOff }

// Policy configures bypass enforcement (ARCHITECTURE.md invariant 3: the agent's
// NVML view is the authority).
type Policy struct {
	// Mode is what to do; the zero value means ModeReport.
	Mode Mode
	// TolerancePercent is how far above its cap a slice's NVML memory may
	// go before it counts as over, in percent of the cap, 0..100; NVML
	// counts context and allocator overhead that the hook cannot see.
	// Default (0 value) 5.
	TolerancePercent int
	// Samples is how many consecutive samples a condition must hold before
	// the agent acts; >= 1, default (0 value) 3.
	Samples int
	// OrphanGrace is how long a GPU process must have been seen in no
	// slice, besides Samples samples, before the agent acts on it, so that
	// a new pod the pod watcher has not caught up with is not taken for a
	// bypass. Default (0 value) 30 s; negative means none.
	OrphanGrace time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.Mode == "" {
		p.Mode = ModeReport
	}
	if p.TolerancePercent == 0 {
		p.TolerancePercent = 5
	}
	if p.Samples == 0 {
		p.Samples = 3
	}
	if p.OrphanGrace == 0 {
		p.OrphanGrace = 30 * time.Second
	}
	return p
}

// String is the policy as audit records name it.
func (p Policy) String() string {
	return fmt.Sprintf("%s tolerance=%d%% samples=%d orphan-grace=%s", p.Mode, p.TolerancePercent, p.Samples, max(p.OrphanGrace, 0))
}

// Killer ends a process. The consumer-side seam for tests.
type Killer interface {
	// Kill sends SIGKILL to pid if it is still the process that started at
	// startTicks (proc(5) stat field 22); a process that is gone is an
	// error wrapping ErrNoProcess.
	Kill(pid uint32, startTicks uint64) error
}

// Auditor records enforcement decisions.
type Auditor interface {
	AddAudit(ctx context.Context, r agentstore.AuditRecord) error
}

// enforcer keeps the consecutive-sample counts across rounds. Used from the
// sampling goroutine only.
type enforcer struct {
	policy Policy
	over   map[string]int // slice id → consecutive over-memory samples
	orphan map[nsKey]int  // (pid, start) → consecutive samples without a slice
	since  map[nsKey]time.Time
}

func newEnforcer(p Policy) *enforcer {
	return &enforcer{policy: p.withDefaults(), over: map[string]int{}, orphan: map[nsKey]int{}, since: map[nsKey]time.Time{}}
}

// verdict is one action the enforcer decided.
type verdict struct {
	reason  string // "over-memory" or "no-slice"
	proc    gpuProcess
	slice   *sliceRound // nil for no-slice
	samples int
}

// judge updates the counts with r and returns the processes to act on. A
// slice over its cap yields its largest process (one per round, so the
// next rounds see whether that sufficed); each orphan process yields
// itself. Counts restart after an action, so a report is not repeated every
// round and a kill gets Samples rounds to take effect.
func (e *enforcer) judge(r round) []verdict {
	if e.policy.Mode == ModeOff {
		return nil
	}
	var out []verdict
	live := map[string]bool{}
	for _, s := range r.Slices {
		live[s.Info.ID] = true
		if !s.MemoryKnown {
			// Unknown is never a violation (ARCHITECTURE.md invariant 4).
			delete(e.over, s.Info.ID)
			continue
		}
		allowed := s.LimitBytes + s.LimitBytes*uint64(e.policy.TolerancePercent)/100
		if s.UsedBytes <= allowed || len(s.Processes) == 0 {
			delete(e.over, s.Info.ID)
			continue
		}
		e.over[s.Info.ID]++
		if n := e.over[s.Info.ID]; n >= e.policy.Samples {
			largest := slices.MaxFunc(s.Processes, func(a, b gpuProcess) int {
				return int(int64(a.MemoryBytes>>10) - int64(b.MemoryBytes>>10))
			})
			out = append(out, verdict{reason: "over-memory", proc: largest, slice: s, samples: n})
			delete(e.over, s.Info.ID)
		}
	}
	for id := range e.over {
		if !live[id] {
			delete(e.over, id)
		}
	}
	seen := map[nsKey]bool{}
	for _, p := range r.Orphans {
		k := nsKey{pid: p.PID, start: p.StartTimeTicks}
		seen[k] = true
		e.orphan[k]++
		if _, ok := e.since[k]; !ok {
			e.since[k] = r.At
		}
		if n := e.orphan[k]; n >= e.policy.Samples && r.At.Sub(e.since[k]) >= e.policy.OrphanGrace {
			out = append(out, verdict{reason: "no-slice", proc: p, samples: n})
			delete(e.orphan, k)
			delete(e.since, k)
		}
	}
	for k := range e.orphan {
		if !seen[k] {
			delete(e.orphan, k)
			delete(e.since, k)
		}
	}
	return out
}

// enforce acts on the verdicts of r: audit always, kill in ModeKill.
// Errors of the audit writes are joined and returned; kill failures are
// recorded in the audit record itself.
func (a *Agent) enforce(ctx context.Context, r round) error {
	var errs []error
	for _, v := range a.enforcer.judge(r) {
		rec := agentstore.AuditRecord{
			At:        a.clock.Now(),
			Node:      a.cfg.Node,
			Action:    string(a.enforcer.policy.Mode),
			Reason:    v.reason,
			Policy:    a.enforcer.policy.String(),
			PID:       v.proc.PID,
			GPU:       v.proc.GPU,
			Container: v.proc.ContainerID,
			Samples:   v.samples,
		}
		if v.slice != nil {
			rec.Slice, rec.Pod, rec.Namespace = v.slice.Info.ID, v.slice.Info.Pod, v.slice.Info.Namespace
			rec.User, rec.Server = v.slice.Info.User, v.slice.Info.Server
			rec.MemoryUsedMiB = int64(v.slice.UsedBytes / mib)
			rec.MemoryLimitMiB = int64(v.slice.LimitBytes / mib)
		} else {
			rec.MemoryUsedMiB = int64(v.proc.MemoryBytes / mib)
		}
		if a.enforcer.policy.Mode == ModeKill {
			if err := a.killer.Kill(v.proc.PID, v.proc.StartTimeTicks); err != nil {
				rec.Action = "kill-failed"
				rec.Error = err.Error()
				if errors.Is(err, ErrNoProcess) {
					rec.Error = "process already gone"
				}
			}
		}
		a.metrics.actions.WithLabelValues(rec.Action, rec.Reason).Inc()
		a.log.WarnContext(ctx, "slice bypass", "action", rec.Action, "reason", rec.Reason, "slice_id", rec.Slice,
			"pod", rec.Pod, "namespace", rec.Namespace, "pid", rec.PID, "gpu_uuid", rec.GPU,
			"mem_mib", rec.MemoryUsedMiB, "limit_mib", rec.MemoryLimitMiB, "samples", rec.Samples, "err", rec.Error)
		if err := a.audit.AddAudit(ctx, rec); err != nil {
			errs = append(errs, fmt.Errorf("audit pid %s: %w", strconv.FormatUint(uint64(rec.PID), 10), err))
		}
	}
	return errors.Join(errs...)
}
