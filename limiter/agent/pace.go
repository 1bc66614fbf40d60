package agent

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// The pace feed: inside a container NVML reports host pids, so the hook
// cannot measure its own slice's SM use; the agent, which sees host pids,
// publishes each slice's and each device's SM use into the slice's usage
// region (region.WriteAgentSample) every PaceInterval, and the hook's
// compute controller steers by it (limiter/hook/README.md, "Compute").
//
// Time source: the samples are stamped with the host's wall clock
// (Deps.Wall, default time.Now), because hooks compare the stamp with their
// own CLOCK_REALTIME and ignore samples older than 500 ms.

// paceHoldTicks is how many pace rounds a process's last utilization is
// held when NVML has no newer sample for it (NVML samples processes every
// 1/6 s or so, more slowly than the pace feed), before it counts as idle.
const paceHoldTicks = 10

// paceHold is a process's last measured SM use on one device.
type paceHold struct {
	permille uint32
	age      int // pace rounds since the last new sample
}

// setPaceOwners records, after a sampling round, which slice each mapped
// pid belongs to and which slices each GPU holds; the pace feed uses them
// until the next round.
func (a *Agent) setPaceOwners(r round) {
	owners := map[uint32]string{}
	byGPU := map[string][]string{}
	for _, s := range r.Slices {
		byGPU[s.Info.GPU] = append(byGPU[s.Info.GPU], s.Info.ID)
		for _, p := range s.Processes {
			owners[p.PID] = s.Info.ID
		}
	}
	a.paceMu.Lock()
	a.paceOwners, a.paceSlices = owners, byGPU
	a.paceMu.Unlock()
}

// paceLoop runs the pace feed every PaceInterval until ctx ends.
func (a *Agent) paceLoop(ctx context.Context) error {
	return a.every(ctx, a.cfg.PaceInterval, a.paceRound)
}

// paceRound publishes one sample per local slice. A device whose
// utilization cannot be read gets no samples (the hooks then fall back to
// their own measurement or start rate: missing, never zero).
func (a *Agent) paceRound(ctx context.Context) {
	a.paceMu.Lock()
	owners, byGPU := a.paceOwners, a.paceSlices
	a.paceMu.Unlock()
	now := a.wall()
	for _, d := range a.devs.list {
		ids := byGPU[d.report.UUID]
		if len(ids) == 0 || d.parent != nil {
			continue // no slices, or a MIG instance (unpaced, no per-process utilization)
		}
		if ok, _ := a.devs.healthy(d); !ok {
			continue
		}
		utils, ret := d.handle.GetProcessUtilization(d.paceSeenUs)
		if ret == nvml.ERROR_INSUFFICIENT_SIZE && len(utils) > 0 {
			utils, ret = d.handle.GetProcessUtilization(d.paceSeenUs)
		}
		switch {
		case ret == nvml.SUCCESS, ret == nvml.ERROR_NOT_FOUND, ret == nvml.ERROR_INSUFFICIENT_SIZE && len(utils) == 0:
		case lostReturn(ret):
			a.lose(ctx, d, "gpu lost: process utilization: "+ret.Error(), a.clock.Now())
			continue
		default:
			continue
		}
		sum := map[uint32]uint64{}
		n := map[uint32]uint64{}
		for _, u := range utils {
			sum[u.Pid] += uint64(u.SmUtil)
			n[u.Pid]++
			d.paceSeenUs = max(d.paceSeenUs, u.TimeStamp)
		}
		if d.pace == nil {
			d.pace = map[uint32]*paceHold{}
		}
		for pid, h := range d.pace {
			if n[pid] == 0 {
				h.age++
				if h.age > paceHoldTicks {
					delete(d.pace, pid)
				}
			}
		}
		for pid, c := range n {
			d.pace[pid] = &paceHold{permille: uint32(min(sum[pid]*10/c, 1000))}
		}
		var device uint32
		slice := map[string]uint32{}
		for pid, h := range d.pace {
			device += h.permille
			if id, ok := owners[pid]; ok {
				slice[id] += h.permille
			}
		}
		for _, id := range ids {
			path := a.slicePath(id, "usage", v1.UsageFileName)
			if u, err := region.ReadUsage(path); err == nil {
				var launches uint64
				for _, p := range u.Processes {
					launches += p.LaunchCount
				}
				a.guarantees.tick(id, launches)
			}
			s := region.AgentSample{Time: now, SliceUtilPermille: min(slice[id], 1000), DeviceUtilPermille: min(device, 1000)}
			err := region.WriteAgentSample(path, s)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				// Not yet created by the pod's first hook, or gone: nothing
				// to steer. Other errors are counted, not logged per round.
				a.metrics.errors.WithLabelValues("pace").Inc()
			}
		}
	}
}

// wallNow is the default wall clock of the pace feed.
func wallNow() time.Time { return time.Now() }
