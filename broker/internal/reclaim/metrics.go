package reclaim

import (
	"strings"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Metrics receives the reclaimer's measurements (implemented by
// broker/internal/metrics). Its methods must be safe for concurrent use
// and must not block.
type Metrics interface {
	// ObserveCycle records one cycle's duration and whether it failed.
	ObserveCycle(d time.Duration, failed bool)
	// ObserveDecision records one running server's verdict ("active",
	// "idle", "unknown") with its reason class (ReasonClass).
	ObserveDecision(verdict, reason string)
	// ObserveAction records one action ("warn", "shrink", "restore",
	// "stop") by reason ("idle", "max_age", "in_use"), done or, with
	// dryRun, only decided and audited.
	ObserveAction(action, reason string, dryRun bool)
	// ObserveFreed records the guaranteed compute the reclaimer holds
	// freed after a cycle, in GPUs (a 25 % slice is 0.25): stopGPUs for the
	// servers it stopped that are still stopped, shrinkGPUs for the
	// compute taken from servers it shrank; over is the time since the
	// previous cycle, over which the share counts as freed.
	ObserveFreed(stopGPUs, shrinkGPUs float64, over time.Duration)
}

// The reasons of actions, as Metrics receives them.
const (
	whyIdle   = "idle"
	whyMaxAge = "max_age"
	whyInUse  = "in_use"
)

// ReasonClass names a verdict's reason with one of a fixed set of words,
// for metrics (the reasons themselves carry times and probe errors):
// gpu_busy, kernel_launch, kernel_busy, notebook_used, min_running for
// active; idle; no_samples, stale_samples, no_sm_reading, probe_failed
// for unknown.
func ReasonClass(verdict Verdict, reason string) string {
	switch verdict {
	case VerdictIdle:
		return "idle"
	case VerdictActive:
		switch reason {
		case reasonGPUBusy:
			return "gpu_busy"
		case reasonKernelLaunch:
			return "kernel_launch"
		case reasonKernelBusy:
			return "kernel_busy"
		case reasonNotebookUsed:
			return "notebook_used"
		default:
			return "min_running"
		}
	default:
		switch {
		case reason == reasonNoSamples:
			return "no_samples"
		case strings.HasPrefix(reason, reasonStale):
			return "stale_samples"
		case strings.HasPrefix(reason, reasonNoSM):
			return "no_sm_reading"
		default:
			return "probe_failed"
		}
	}
}

// actionName is the metrics name of an audit action: reclaim.warn → warn.
func actionName(audit string) string { return strings.TrimPrefix(audit, "reclaim.") }

// noMetrics discards measurements.
type noMetrics struct{}

func (noMetrics) ObserveCycle(time.Duration, bool)             {}
func (noMetrics) ObserveDecision(string, string)               {}
func (noMetrics) ObserveAction(string, string, bool)           {}
func (noMetrics) ObserveFreed(float64, float64, time.Duration) {}

// freedByStops is the guaranteed compute, in GPUs, of the servers whose
// current record is stopped by the reclaimer (states[i] belongs to
// stopped[i]): their slices stay free while the server is not started
// again (a start replaces the record with a new spawn).
func freedByStops(stopped []fleet.Server, states []IdleState) float64 {
	var gpus float64
	for i, s := range stopped {
		if i < len(states) && s.State == v1.StateStopped && !states[i].StoppedAt.IsZero() {
			gpus += float64(s.Slice.ComputePercent) / 100
		}
	}
	return gpus
}
