package reclaim

import (
	"fmt"
	"strconv"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Verdict is what the reclaimer makes of a running server; the wire type
// itself (v1.IdleVerdict).
type Verdict = v1.IdleVerdict

// The verdicts. Only VerdictIdle can lead to an action (ARCHITECTURE.md invariant
// 4: missing data is unknown, never idle).
const (
	VerdictActive  = v1.IdleActive
	VerdictIdle    = v1.IdleIdle
	VerdictUnknown = v1.IdleUnknown
)

// Reasons for the active verdict; kept without figures so that the stored
// state changes only when the reason does.
const (
	reasonGPUBusy      = "the GPU is busy"
	reasonKernelLaunch = "GPU kernels were launched recently"
	reasonKernelBusy   = "a kernel is running code"
	reasonNotebookUsed = "the notebook was used recently"
	reasonMinRunning   = "started recently (minimum running time)"
	reasonProxyUsed    = "the notebook was used through the broker recently"
)

// Reasons for the unknown verdict; the last two begin a longer reason.
const (
	reasonNoSamples = "the node agent has reported no GPU samples for this server"
	reasonStale     = "the GPU samples are stale"
	reasonNoSM      = "GPU utilization is unknown"
)

// Sample is the part of a node agent's usage sample (ARCHITECTURE.md
// "Sample") that the reclaimer judges by; the Samples store converts the
// agent contract's records (agentstore.Sample) into it.
type Sample struct {
	// ID is the sample's stream id; samples of one slice are ordered by it.
	ID string
	// At is when the agent took the sample (the agent's clock).
	At time.Time
	// FreshUntil is the last instant at which the sample counts as fresh
	// (agentstore.Sample.FreshUntil: At plus three sampling intervals); the
	// zero time means always stale.
	FreshUntil time.Time
	// SMPercent is the slice's SM utilization, percent of the GPU; nil when
	// the agent could not measure it (Missing says why).
	SMPercent *int
	// LastKernel is the last kernel launch the hooks recorded; nil when not
	// reported, the zero time when none was recorded yet.
	LastKernel *time.Time
	// Missing names why readings are missing ("" when none are).
	Missing string
}

// Stale reports whether the sample is stale at now.
func (s Sample) Stale(now time.Time) bool { return now.After(s.FreshUntil) }

// observation is one server's classification in one cycle.
type observation struct {
	verdict Verdict
	// reason says why active or unknown ("" for idle).
	reason string
	// inputs are the figures the verdict used, for the audit record.
	inputs map[string]string
}

// gpuEvidence classifies a server by its samples alone (newest first) at
// now, looking back over lookback: active when any fresh sample in the
// window shows SM use above idlePercent or a kernel launch; unknown when
// there are no samples, the newest is stale, or its SM reading is missing;
// otherwise idle (the notebook's own activity decides then).
func gpuEvidence(now time.Time, samples []Sample, idlePercent int, lookback time.Duration, inputs map[string]string) (Verdict, string) {
	if len(samples) == 0 {
		return VerdictUnknown, reasonNoSamples
	}
	newest := samples[0]
	inputs["sampleAt"] = newest.At.UTC().Format(time.RFC3339)
	if newest.Stale(now) {
		return VerdictUnknown, fmt.Sprintf("%s (the newest is from %s)", reasonStale, newest.At.UTC().Format("15:04:05 UTC"))
	}
	if newest.SMPercent == nil {
		why := newest.Missing
		if why == "" {
			why = "not reported"
		}
		return VerdictUnknown, reasonNoSM + ": " + why
	}
	from := now.Add(-lookback)
	maxSM := -1
	for _, s := range samples {
		if s.At.Before(from) && s.ID != newest.ID {
			break
		}
		if s.SMPercent != nil && *s.SMPercent > maxSM {
			maxSM = *s.SMPercent
		}
		if s.LastKernel != nil && !s.LastKernel.IsZero() && !s.LastKernel.Before(from) {
			inputs["lastKernel"] = s.LastKernel.UTC().Format(time.RFC3339)
			return VerdictActive, reasonKernelLaunch
		}
	}
	inputs["smPercent"] = strconv.Itoa(maxSM)
	inputs["idleComputePercent"] = strconv.Itoa(idlePercent)
	if maxSM > idlePercent {
		return VerdictActive, reasonGPUBusy
	}
	return VerdictIdle, ""
}

// notebookEvidence classifies by the notebook's own activity; probeErr
// non-nil means unknown with its text as the reason.
func notebookEvidence(now time.Time, a Activity, probeErr error, lookback time.Duration, inputs map[string]string) (Verdict, string) {
	if probeErr != nil {
		return VerdictUnknown, probeErr.Error()
	}
	inputs["kernels"] = strconv.Itoa(a.Kernels)
	inputs["busyKernels"] = strconv.Itoa(a.BusyKernels)
	inputs["terminals"] = strconv.Itoa(a.Terminals)
	if !a.LastActivity.IsZero() {
		inputs["lastActivity"] = a.LastActivity.UTC().Format(time.RFC3339)
	}
	if a.BusyKernels > 0 {
		return VerdictActive, reasonKernelBusy
	}
	if !a.LastActivity.IsZero() && !a.LastActivity.Before(now.Add(-lookback)) {
		return VerdictActive, reasonNotebookUsed
	}
	return VerdictIdle, ""
}

// proxyEvidence classifies a server whose GPU and notebook look idle by
// the broker's proxy: a request through it within lookback makes it
// active; anything else (no record, an old request) leaves it idle. Open
// WebSockets are an input only: a tab left open is not use.
func proxyEvidence(now time.Time, a fleet.ProxyActivity, ok bool, lookback time.Duration, inputs map[string]string) (Verdict, string) {
	if !ok {
		return VerdictIdle, ""
	}
	inputs["proxyWebSockets"] = strconv.Itoa(a.OpenWebSockets)
	if !a.LastRequest.IsZero() {
		inputs["proxyLastRequest"] = a.LastRequest.UTC().Format(time.RFC3339)
		if !a.LastRequest.Before(now.Add(-lookback)) {
			return VerdictActive, reasonProxyUsed
		}
	}
	return VerdictIdle, ""
}
