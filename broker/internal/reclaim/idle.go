package reclaim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// Verdict is what the reclaimer makes of a running server.
type Verdict string

// The verdicts. Only VerdictIdle can lead to an action (ARCHITECTURE.md invariant
// 4: missing data is unknown, never idle).
const (
	VerdictActive  Verdict = "active"
	VerdictIdle    Verdict = "idle"
	VerdictUnknown Verdict = "unknown"
)

// Reasons for the active verdict; kept without figures so that the stored
// state changes only when the reason does.
const (
	reasonGPUBusy      = "the GPU is busy"
	reasonKernelLaunch = "GPU kernels were launched recently"
	reasonKernelBusy   = "a kernel is running code"
	reasonNotebookUsed = "the notebook was used recently"
	reasonMinRunning   = "started recently (minimum running time)"
)

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
func gpuEvidence(now time.Time, samples []agentstore.Sample, idlePercent int, lookback time.Duration, inputs map[string]string) (Verdict, string) {
	if len(samples) == 0 {
		return VerdictUnknown, "the node agent has reported no GPU samples for this server"
	}
	newest := samples[0]
	inputs["sampleAt"] = newest.At.UTC().Format(time.RFC3339)
	if newest.Stale(now) {
		return VerdictUnknown, fmt.Sprintf("the GPU samples are stale (the newest is from %s)", newest.At.UTC().Format("15:04:05 UTC"))
	}
	if newest.SMPercent == nil {
		why := newest.Missing
		if why == "" {
			why = "not reported"
		}
		return VerdictUnknown, "GPU utilization is unknown: " + why
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

// sampleFields are agentstore's stream fields that the batch read decodes;
// TestBatchSamplesMatchAgentstore keeps them in step with agentstore.
const (
	sfAt       = "t"
	sfInterval = "iv"
	sfSM       = "sm"
	sfKernel   = "lk"
	sfMissing  = "miss"
)

// decodeBatchSample decodes the fields of an agent sample that reclaim
// uses (At, Interval, SMPercent, LastKernel, Missing). agentstore has no
// pipelined multi-slice read yet; this is its stand-in, tested against
// agentstore.RecentSamples.
func decodeBatchSample(slice string, m redis.XMessage) (agentstore.Sample, error) {
	str := func(f string) string { v, _ := m.Values[f].(string); return v }
	num := func(f string) (int64, bool, error) {
		v := str(f)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("sample %s of slice %s: field %s: %w", m.ID, slice, f, err)
		}
		return n, true, nil
	}
	s := agentstore.Sample{ID: m.ID, Slice: slice, Missing: str(sfMissing)}
	var errs []error
	if v, ok, err := num(sfAt); ok {
		s.At = time.UnixMilli(v).UTC()
	} else if err != nil {
		errs = append(errs, err)
	}
	if v, ok, err := num(sfInterval); ok {
		s.Interval = time.Duration(v) * time.Millisecond
	} else if err != nil {
		errs = append(errs, err)
	}
	if v, ok, err := num(sfSM); ok {
		n := int(v)
		s.SMPercent = &n
	} else if err != nil {
		errs = append(errs, err)
	}
	if v, ok, err := num(sfKernel); ok {
		var t time.Time
		if v != 0 {
			t = time.UnixMilli(v).UTC()
		}
		s.LastKernel = &t
	} else if err != nil {
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}
