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
	// ModeKill stops the offending process (SIGKILL through a pidfd) and
	// writes an audit record: the default, which protects the other tenants
	// of the GPU (ARCHITECTURE.md invariant 3).
	ModeKill Mode = "kill"
	// ModeReport only writes the audit record and a log line.
	ModeReport Mode = "report"
	// ModeOff does nothing.
	ModeOff Mode = "off"
)

// DefaultMode is the mode of a zero Policy: protecting.
const DefaultMode = ModeKill

// DefaultComputeMode is the over-compute mode of a zero Policy: reported,
// not stopped (see Policy.ComputeMode).
const DefaultComputeMode = ModeReport

// computeSamples is how many consecutive samples a slice must be over its
// compute ceiling before the agent acts, at least: a process's first
// second is paced from a feed that has not credited it to its slice yet,
// and a throughput steal, unlike memory, harms nobody's data while the
// agent waits.
const computeSamples = 10

// Valid reports whether m is a known mode.
func (m Mode) Valid() bool { return m == ModeReport || m == ModeKill || m == ModeOff }

// Policy configures bypass enforcement (ARCHITECTURE.md invariant 3: the agent's
// NVML view is the authority).
type Policy struct {
	// Mode is what to do; the zero value means DefaultMode (ModeKill).
	Mode Mode
	// TolerancePercent is how far above its cap a slice's NVML memory may
	// go before it counts as over, in percent of the cap, 0..100; NVML
	// counts context and allocator overhead that the hook cannot see.
	// Default (0 value) 5.
	TolerancePercent int
	// ComputeMode is what to do about a slice over its compute ceiling
	// (over-compute); the zero value means DefaultComputeMode (ModeReport):
	// the hook paces launches, not kernels, so one kernel or CUDA graph
	// longer than its longest wait (200 ms) can take an honest slice past
	// its ceiling, and a shrunk idle slice's first kernels outrun the
	// shrink until the restore. ModeKill stops the slice's busiest process.
	// Mode ModeOff turns every check off, this one included.
	ComputeMode Mode
	// ComputeTolerancePoints is how far above its burst ceiling
	// (computeLimitPercent) a slice's NVML SM share may go before it counts
	// as over, in percentage points of the GPU, 0..100: NVML's per-process
	// utilization is a sampled average and the hook's pacing overshoots
	// briefly after a burst. Default (0 value) 10.
	ComputeTolerancePoints int
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
		p.Mode = DefaultMode
	}
	if p.ComputeMode == "" {
		p.ComputeMode = DefaultComputeMode
	}
	if p.TolerancePercent == 0 {
		p.TolerancePercent = 5
	}
	if p.ComputeTolerancePoints == 0 {
		p.ComputeTolerancePoints = 10
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
	return fmt.Sprintf("%s tolerance=%d%% compute=%s compute-tolerance=%d samples=%d orphan-grace=%s",
		p.Mode, p.TolerancePercent, p.ComputeMode, p.ComputeTolerancePoints, p.Samples, max(p.OrphanGrace, 0))
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
	// overCompute is slice id → consecutive samples over the SM ceiling.
	overCompute map[string]int
	hidden      map[nsKey]int // (pid, start) → consecutive samples hidden from the hook
	orphan      map[nsKey]int // (pid, start) → consecutive samples without a slice
	since       map[nsKey]time.Time
	usage       map[string]string // slice id → the usage problem last reported
}

func newEnforcer(p Policy) *enforcer {
	return &enforcer{policy: p.withDefaults(), over: map[string]int{}, overCompute: map[string]int{}, hidden: map[nsKey]int{}, orphan: map[nsKey]int{},
		since: map[nsKey]time.Time{}, usage: map[string]string{}}
}

// verdict is one action the enforcer decided.
type verdict struct {
	reason  string     // one of agentstore's Reason* constants
	proc    gpuProcess // zero for agentstore.ReasonUsageTampered
	slice   *sliceRound
	samples int
	stop    bool // the mode allows stopping this process
	problem string
}

// judge updates the counts with r and returns what to act on. A slice over
// its cap yields its largest process (one per round, so the next rounds see
// whether that sufficed); each hidden or orphan process yields itself; a
// process is named at most once per round. Counts restart after an action,
// so a report is not repeated every round and a kill gets Samples rounds to
// take effect.
func (e *enforcer) judge(r round) []verdict {
	if e.policy.Mode == ModeOff {
		return nil
	}
	kill := e.policy.Mode == ModeKill
	var out []verdict
	named := map[nsKey]bool{}
	add := func(v verdict) {
		k := nsKey{pid: v.proc.PID, start: v.proc.StartTimeTicks}
		if v.proc.PID != 0 && named[k] {
			return
		}
		named[k] = true
		out = append(out, v)
	}
	live := map[string]bool{}
	seenHidden := map[nsKey]bool{}
	for _, s := range r.Slices {
		live[s.Info.ID] = true
		if s.UsageProblem != e.usage[s.Info.ID] {
			e.usage[s.Info.ID] = s.UsageProblem
			if s.UsageProblem != "" {
				add(verdict{reason: agentstore.ReasonUsageTampered, slice: s, samples: 1, problem: s.UsageProblem})
			}
		}
		e.judgeMemory(s, kill, add)
		e.judgeCompute(s, add)
		for _, p := range s.Processes {
			if !p.Hidden {
				continue
			}
			k := nsKey{pid: p.PID, start: p.StartTimeTicks}
			seenHidden[k] = true
			e.hidden[k]++
			if n := e.hidden[k]; n >= e.policy.Samples {
				add(verdict{reason: agentstore.ReasonHidden, proc: p, slice: s, samples: n, stop: kill})
				delete(e.hidden, k)
			}
		}
	}
	for id := range e.over {
		if !live[id] {
			delete(e.over, id)
		}
	}
	for id := range e.overCompute {
		if !live[id] {
			delete(e.overCompute, id)
		}
	}
	for id := range e.usage {
		if !live[id] {
			delete(e.usage, id)
		}
	}
	for k := range e.hidden {
		if !seenHidden[k] {
			delete(e.hidden, k)
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
			// The host's own processes are not a tenant's: reported, never stopped.
			add(verdict{reason: agentstore.ReasonNoSlice, proc: p, samples: n, stop: kill && p.PodUID != ""})
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

// judgeMemory counts slice s over its cap and adds its largest process once the count reaches Samples.
func (e *enforcer) judgeMemory(s *sliceRound, kill bool, add func(verdict)) {
	if !s.MemoryKnown {
		// Unknown is never a violation (ARCHITECTURE.md invariant 4).
		delete(e.over, s.Info.ID)
		return
	}
	allowed := s.LimitBytes + s.LimitBytes*uint64(e.policy.TolerancePercent)/100
	if s.UsedBytes <= allowed || len(s.Processes) == 0 {
		delete(e.over, s.Info.ID)
		return
	}
	e.over[s.Info.ID]++
	if n := e.over[s.Info.ID]; n >= e.policy.Samples {
		largest := slices.MaxFunc(s.Processes, func(a, b gpuProcess) int {
			return int(int64(a.MemoryBytes>>10) - int64(b.MemoryBytes>>10))
		})
		add(verdict{reason: agentstore.ReasonOverMemory, proc: largest, slice: s, samples: n, stop: kill})
		delete(e.over, s.Info.ID)
	}
}

// judgeCompute counts slice s over its SM burst ceiling (NVML's view, the
// authority: the usage region that paces the hook is the tenant's to
// write, and a process may bypass the hook) and adds its busiest process
// once the count reaches Samples, and at least computeSamples, under
// ComputeMode. An unknown SM share is never a violation (ARCHITECTURE.md
// invariant 4).
func (e *enforcer) judgeCompute(s *sliceRound, add func(verdict)) {
	sm := s.Sample.SMPercent
	if e.policy.ComputeMode == ModeOff || sm == nil || s.ComputeLimitPercent <= 0 ||
		*sm <= s.ComputeLimitPercent+e.policy.ComputeTolerancePoints || len(s.Processes) == 0 {
		delete(e.overCompute, s.Info.ID)
		return
	}
	e.overCompute[s.Info.ID]++
	if n := e.overCompute[s.Info.ID]; n >= max(e.policy.Samples, computeSamples) {
		busiest := slices.MaxFunc(s.Processes, func(a, b gpuProcess) int { return a.SMPercent - b.SMPercent })
		add(verdict{reason: agentstore.ReasonOverCompute, proc: busiest, slice: s, samples: n, stop: e.policy.ComputeMode == ModeKill})
		delete(e.overCompute, s.Info.ID)
	}
}

// enforce acts on the verdicts of r: audit always, stop where the mode and
// the verdict allow it. Errors of the audit writes are joined and returned;
// kill failures are recorded in the audit record itself.
func (a *Agent) enforce(ctx context.Context, r round) error {
	var errs []error
	for _, v := range a.enforcer.judge(r) {
		rec := agentstore.AuditRecord{
			At:        a.clock.Now(),
			Node:      a.cfg.Node,
			Action:    agentstore.ActionReport,
			Reason:    v.reason,
			Policy:    a.enforcer.policy.String(),
			PID:       v.proc.PID,
			GPU:       v.proc.GPU,
			Container: v.proc.ContainerID,
			Samples:   v.samples,
			Error:     v.problem,
		}
		if v.proc.MemoryKnown {
			rec.ProcessMemoryMiB = int64(v.proc.MemoryBytes / mib)
		}
		rec.MemoryUsedMiB = rec.ProcessMemoryMiB
		if v.slice != nil {
			rec.Slice, rec.Pod, rec.Namespace = v.slice.Info.ID, v.slice.Info.Pod, v.slice.Info.Namespace
			rec.User, rec.Server = v.slice.Info.User, v.slice.Info.Server
			rec.MemoryLimitMiB = int64(v.slice.LimitBytes / mib)
			if rec.GPU == "" {
				rec.GPU = v.slice.Info.GPU
			}
			if v.reason == agentstore.ReasonOverMemory {
				rec.MemoryUsedMiB = int64(v.slice.UsedBytes / mib)
			}
			if v.reason == agentstore.ReasonOverCompute && v.slice.Sample.SMPercent != nil {
				rec.SMPercent, rec.ComputeLimitPercent = *v.slice.Sample.SMPercent, v.slice.ComputeLimitPercent
			}
		}
		if v.stop {
			rec.Action = agentstore.ActionKill
			if err := a.killer.Kill(v.proc.PID, v.proc.StartTimeTicks); err != nil {
				rec.Action = agentstore.ActionKillFailed
				rec.Error = err.Error()
				if errors.Is(err, ErrNoProcess) {
					rec.Error = "process already gone"
				}
			}
		}
		a.metrics.actions.WithLabelValues(rec.Action, rec.Reason).Inc()
		a.log.WarnContext(ctx, "slice bypass", "action", rec.Action, "reason", rec.Reason, "slice_id", rec.Slice,
			"pod", rec.Pod, "namespace", rec.Namespace, "pid", rec.PID, "gpu_uuid", rec.GPU,
			"mem_mib", rec.MemoryUsedMiB, "limit_mib", rec.MemoryLimitMiB, "sm_percent", rec.SMPercent, "compute_limit_percent", rec.ComputeLimitPercent, "samples", rec.Samples, "err", rec.Error)
		if err := a.audit.AddAudit(ctx, rec); err != nil {
			errs = append(errs, fmt.Errorf("audit pid %s: %w", strconv.FormatUint(uint64(rec.PID), 10), err))
		}
	}
	return errors.Join(errs...)
}
