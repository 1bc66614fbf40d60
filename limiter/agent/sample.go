package agent

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/region"
)

const mib = 1 << 20

// gpuProcess is one process on one GPU in one sampling round.
type gpuProcess struct {
	Process
	GPU string
	// MemoryBytes is the device memory NVML reports for the process;
	// valid when MemoryKnown.
	MemoryBytes uint64
	MemoryKnown bool
	// SMPercent is the mean of the process's utilization samples in the
	// round, percent of the device; 0 when it had none.
	SMPercent int
	// Slice is the process's slice; nil when it belongs to none.
	Slice *SliceInfo
	// Hidden: the process is in its slice's pod (by cgroup) but has no slot
	// in the slice's usage region, which every process that goes through
	// the hook claims at cuInit: it reaches the GPU past the hook. Only set
	// when the region was read.
	Hidden bool
}

// sliceRound is one slice's figures in one sampling round.
type sliceRound struct {
	Info SliceInfo
	// LimitBytes is the memory cap in effect: the quota file's when it is
	// valid, else the pod's initial slice.
	LimitBytes uint64
	// ComputeLimitPercent is the SM share's burst ceiling in effect,
	// percent of the GPU, from the same source (see sliceLimits).
	ComputeLimitPercent int
	// UsedBytes is Σ memory of its processes; valid when MemoryKnown.
	UsedBytes   uint64
	MemoryKnown bool
	Processes   []gpuProcess
	Sample      agentstore.Sample
	// UsageProblem says why the slice's usage region could not be used
	// (replaced, not a regular file, corrupt); "" when it was read or does
	// not exist yet.
	UsageProblem string
	// DeviceSMPercent is its GPU's SM use in the round, percent; nil when
	// unknown.
	DeviceSMPercent *int
}

// round is the result of one sampling pass over every device.
type round struct {
	At     time.Time
	Slices []*sliceRound
	// Orphans are GPU processes that belong to no slice.
	Orphans []gpuProcess
}

// deviceRound is what one device reported in a round.
type deviceRound struct {
	missing   []string // reasons why figures of its slices are missing
	memKnown  bool     // the running-process list (pids and memory) is known
	smKnown   bool     // per-process utilization is known
	smPercent int      // the device's SM use, percent (sum over processes, at most 100); valid when smKnown
	processes []gpuProcess
}

// sampleRound queries NVML for every device, maps processes to slices and
// builds one sample per local slice. It never fails as a whole: what it
// cannot read is recorded as missing in the samples.
func (a *Agent) sampleRound(ctx context.Context) round {
	now := a.clock.Now()
	r := round{At: now}
	local := a.pods.Slices()
	usagePIDs := map[nsKey]string{} // (ns pid, start) → slice id, from usage regions
	usage := make(map[string]usageView, len(local))
	for _, s := range local {
		u := a.readUsage(s.ID)
		usage[s.ID] = u
		if a.cfg.TrustUsagePIDs {
			for _, p := range u.pids {
				usagePIDs[p] = s.ID
			}
		}
	}
	byID := make(map[string]*SliceInfo, len(local))
	for i := range local {
		byID[local[i].ID] = &local[i]
	}

	seen := map[uint32]bool{}
	devRounds := make(map[string]*deviceRound, len(a.devs.list))
	for _, d := range a.devs.list {
		dr := a.sampleDevice(ctx, d, now, byID, usagePIDs, seen)
		devRounds[d.report.UUID] = dr
		for _, p := range dr.processes {
			if p.Slice == nil {
				r.Orphans = append(r.Orphans, p)
			}
		}
	}
	for pid := range a.procCache {
		if !seen[pid] {
			delete(a.procCache, pid)
		}
	}

	for i := range local {
		s := &local[i]
		lim := a.limitsOf(*s)
		sr := &sliceRound{Info: *s, LimitBytes: lim.memoryBytes, ComputeLimitPercent: lim.computeLimitPercent, UsageProblem: usage[s.ID].err}
		u := usage[s.ID]
		sample := agentstore.Sample{
			Slice:          s.ID,
			At:             now,
			Interval:       a.cfg.SampleInterval,
			MemoryLimitMiB: int64(sr.LimitBytes / mib),
		}
		var missing []string
		dr, ok := devRounds[s.GPU]
		if !ok {
			missing = append(missing, "gpu "+s.GPU+" is not on this node")
			dr = &deviceRound{}
		}
		missing = append(missing, dr.missing...)
		sm := 0
		sr.MemoryKnown = dr.memKnown
		for _, p := range dr.processes {
			if p.Slice == nil || p.Slice.ID != s.ID {
				continue
			}
			p.Hidden = u.read && p.PodUID != "" && !slices.Contains(u.pids, nsKey{pid: p.NSPid, start: p.StartTimeTicks})
			sr.Processes = append(sr.Processes, p)
			sm += p.SMPercent
			if p.MemoryKnown {
				sr.UsedBytes += p.MemoryBytes
			} else {
				sr.MemoryKnown = false
			}
		}
		if dr.smKnown {
			sm = min(sm, 100)
			sample.SMPercent = &sm
			dev := dr.smPercent
			sr.DeviceSMPercent = &dev
		}
		if dr.memKnown {
			n := len(sr.Processes)
			sample.Processes = &n
			if sr.MemoryKnown {
				used := int64((sr.UsedBytes + mib - 1) / mib)
				sample.MemoryUsedMiB = &used
			} else {
				missing = append(missing, "process memory not available")
			}
		}
		if u.err != "" {
			missing = append(missing, u.err)
		} else {
			lk := u.lastKernel
			sample.LastKernel = &lk
		}
		sample.Missing = strings.Join(missing, "; ")
		sr.Sample = sample
		a.measureGuarantee(sr, u)
		r.Slices = append(r.Slices, sr)
	}
	return r
}

// sampleDevice reads one device's processes and utilization.
func (a *Agent) sampleDevice(ctx context.Context, d *device, now time.Time, byID map[string]*SliceInfo,
	usagePIDs map[nsKey]string, seen map[uint32]bool) *deviceRound {
	dr := &deviceRound{}
	uuid := d.report.UUID
	if ok, reason := a.devs.healthy(d); !ok {
		dr.missing = append(dr.missing, "gpu unhealthy: "+reason)
		return dr
	}
	if d.report.MIGEnabled {
		// Its processes are its instances'; they are sampled there.
		dr.missing = append(dr.missing, "gpu "+uuid+" is in MIG mode; its MIG instances hold the slices")
		return dr
	}
	procs, ret := d.handle.GetComputeRunningProcesses()
	switch {
	case ret == nvml.SUCCESS:
		dr.memKnown = true
	case lostReturn(ret):
		a.lose(ctx, d, "gpu lost: running processes: "+ret.Error(), now)
		dr.missing = append(dr.missing, "gpu lost: running processes: "+ret.Error())
		return dr
	default:
		a.metrics.errors.WithLabelValues("nvml").Inc()
		dr.missing = append(dr.missing, "running processes: "+ret.Error())
	}
	var utils []nvml.ProcessUtilizationSample
	if d.parent != nil {
		// NVML has no per-process utilization on MIG devices.
		ret = nvml.ERROR_NOT_SUPPORTED
	} else {
		utils, ret = d.handle.GetProcessUtilization(d.lastSeenUs)
		if ret == nvml.ERROR_INSUFFICIENT_SIZE && len(utils) > 0 {
			// More samples arrived between go-nvml's size probe and its read.
			utils, ret = d.handle.GetProcessUtilization(d.lastSeenUs)
		}
	}
	switch {
	case ret == nvml.SUCCESS, ret == nvml.ERROR_NOT_FOUND,
		ret == nvml.ERROR_INSUFFICIENT_SIZE && len(utils) == 0:
		// NOT_FOUND (and the empty size probe) mean no process ran kernels
		// since lastSeen: a measured 0 %, not missing data.
		dr.smKnown = true
	case lostReturn(ret):
		a.lose(ctx, d, "gpu lost: process utilization: "+ret.Error(), now)
		return &deviceRound{missing: []string{"gpu lost: process utilization: " + ret.Error()}}
	default:
		if ret != nvml.ERROR_NOT_SUPPORTED {
			a.metrics.errors.WithLabelValues("nvml").Inc()
		}
		dr.missing = append(dr.missing, "process utilization: "+ret.Error())
	}
	smSum := map[uint32]uint64{}
	smN := map[uint32]uint64{}
	if dr.smKnown {
		for _, u := range utils {
			smSum[u.Pid] += uint64(u.SmUtil)
			smN[u.Pid]++
			d.lastSeenUs = max(d.lastSeenUs, u.TimeStamp)
		}
	}
	pids := make([]uint32, 0, len(procs)+len(smN))
	mem := map[uint32]uint64{}
	for _, p := range procs {
		if _, dup := mem[p.Pid]; !dup {
			pids = append(pids, p.Pid)
		}
		mem[p.Pid] += p.UsedGpuMemory
		if p.UsedGpuMemory == math.MaxUint64 {
			mem[p.Pid] = math.MaxUint64
		}
	}
	if !dr.memKnown {
		// Without the process list, the processes that ran kernels are all
		// the agent knows about.
		for pid := range smN {
			pids = append(pids, pid)
		}
	}
	var gpuSM, gpuMem uint64
	for _, pid := range pids {
		info, err := a.process(pid)
		if errors.Is(err, ErrNoProcess) {
			continue // exited since NVML listed it
		}
		if err != nil {
			a.metrics.errors.WithLabelValues("proc").Inc()
			a.log.DebugContext(ctx, "process unreadable", "pid", pid, "err", err)
		}
		seen[pid] = true
		gp := gpuProcess{Process: info, GPU: uuid}
		if m, ok := mem[pid]; ok && m != math.MaxUint64 {
			gp.MemoryBytes, gp.MemoryKnown = m, true
			gpuMem += m
		}
		if n := smN[pid]; n > 0 {
			gp.SMPercent = int(smSum[pid] / n)
			gpuSM += smSum[pid] / n
		}
		gp.Slice = a.sliceOf(info, byID, usagePIDs)
		dr.processes = append(dr.processes, gp)
	}
	if dr.smKnown {
		dr.smPercent = int(min(gpuSM, 100))
		a.metrics.gpuSM.WithLabelValues(uuid).Set(float64(dr.smPercent))
	}
	if dr.memKnown {
		a.metrics.gpuMemUsed.WithLabelValues(uuid).Set(float64(gpuMem))
	}
	return dr
}

// lose marks d unhealthy (with its MIG instances, or its GPU's) and logs
// it once.
func (a *Agent) lose(ctx context.Context, d *device, reason string, now time.Time) {
	if a.devs.markLost(d, reason, now) {
		a.lost(ctx, d, reason)
	}
}

// lost logs and exports that d's GPU and its MIG instances are unhealthy.
func (a *Agent) lost(ctx context.Context, d *device, reason string) {
	if d.parent != nil {
		d = d.parent
	}
	a.log.WarnContext(ctx, "gpu marked unhealthy", "gpu_uuid", d.report.UUID, "reason", reason, "mig_instances", len(d.instances))
	for _, x := range append([]*device{d}, d.instances...) {
		a.metrics.healthy.WithLabelValues(x.report.UUID).Set(0)
	}
}

// process returns what /proc says about pid, from a cache keyed by pid and
// validated by the start time, so a reused pid is never confused with its
// previous owner.
func (a *Agent) process(pid uint32) (Process, error) {
	start, err := a.proc.StartTime(pid)
	if err != nil {
		return Process{PID: pid, NSPid: pid}, err
	}
	if p, ok := a.procCache[pid]; ok && p.StartTimeTicks == start {
		return p, nil
	}
	p, err := a.proc.Process(pid)
	if err != nil {
		return p, err
	}
	a.procCache[pid] = p
	return p, nil
}

// sliceOf maps a process to its slice: by its pod's UID when its cgroup
// names a pod (authoritative; a pod that is not gpubroker's gives no
// slice), else, only with TrustUsagePIDs, by the usage regions' (pid,
// start time) entries, which the tenant's hooks write.
func (a *Agent) sliceOf(p Process, byID map[string]*SliceInfo, usagePIDs map[nsKey]string) *SliceInfo {
	if p.PodUID != "" {
		s, ok := a.pods.ByPodUID(p.PodUID)
		if !ok {
			return nil
		}
		if local, ok := byID[s.ID]; ok {
			return local
		}
		return &s
	}
	if id, ok := usagePIDs[nsKey{pid: p.NSPid, start: p.StartTimeTicks}]; ok {
		return byID[id]
	}
	return nil
}

// nsKey names a process as the usage region does: its pid in its own
// namespace and its start time.
type nsKey struct {
	pid   uint32
	start uint64
}

// usageView is what the agent takes from a slice's usage region.
type usageView struct {
	lastKernel time.Time // zero: no launch recorded
	paceWait   time.Duration
	pids       []nsKey
	read       bool   // the region was read (pids are the slots)
	err        string // why the region could not be used; "" when it was read or does not exist yet
}

// fileID names a file across renames: device and inode.
type fileID struct{ dev, ino uint64 }

// goneUsage is the identity remembered for a usage region that was
// removed: no file has it.
var goneUsage = fileID{dev: ^uint64(0), ino: ^uint64(0)}

func (a *Agent) slicePath(id, sub, file string) string {
	return filepath.Join(a.cfg.HostRoot, v1.HostSlicesSubdir, id, sub, file)
}

// readUsage reads slice id's usage region. A missing file that the agent
// has not seen yet means no hooked process has started (the agent creates
// it): no launch recorded. The first file seen is remembered (device,
// inode) for as long as the slice is on the node; a file that is not that
// one any more (replaced, possible for root in the container) or that is
// gone is not read, and the reason is reported: the hooks that still map
// the first one fail closed, and the processes that account elsewhere are
// not believed. (Forgetting a removed file let a planted one pass for the
// agent's own.) Called from the sampling goroutine only.
func (a *Agent) readUsage(id string) usageView {
	path := a.slicePath(id, "usage", v1.UsageFileName)
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		if _, seen := a.usageIDs[id]; seen {
			// No later file is the agent's, whatever inode it reuses.
			a.usageIDs[id] = goneUsage
			return usageView{err: "usage region removed: the file the agent created is gone"}
		}
		return usageView{}
	}
	if err == nil && !st.Mode().IsRegular() {
		return usageView{err: "usage region unusable: not a regular file"}
	}
	if err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			cur := fileID{dev: uint64(sys.Dev), ino: sys.Ino}
			if first, seen := a.usageIDs[id]; !seen {
				a.usageIDs[id] = cur
			} else if first != cur {
				return usageView{err: "usage region replaced: it is not the file the agent created"}
			}
		}
	}
	u, err := region.ReadUsage(path)
	if err != nil {
		return usageView{err: "usage region unusable: " + usageReason(err)}
	}
	v := usageView{read: true, paceWait: u.Pace.Wait}
	for _, p := range u.Processes {
		if p.LastLaunch.After(v.lastKernel) {
			v.lastKernel = p.LastLaunch
		}
		v.pids = append(v.pids, nsKey{pid: p.PID, start: p.StartTimeTicks})
	}
	return v
}

// sliceLimits are the caps in effect for one slice.
type sliceLimits struct {
	memoryBytes uint64 // the memory cap, bytes
	// computeLimitPercent is the burst ceiling of its SM share, percent of
	// the GPU, 1..100 (100 for a server that is not time-sliced: MPS, MIG
	// and whole GPUs are capped by the GPU itself, see SliceInfo.quota).
	computeLimitPercent int
}

// limitsOfQuota returns the caps quota file q sets.
func limitsOfQuota(q region.Quota) sliceLimits {
	return sliceLimits{memoryBytes: q.MemoryLimitBytes, computeLimitPercent: int(q.ComputeLimitPercent)}
}

// limitsOf returns the caps in effect for s: the quota file's when it is
// valid and names s, else the pod's initial slice (as its first quota file
// says it). The agent is the only writer of quota files, so the caps are
// read once per slice and then kept up to date by applyQuota (a slice that
// is gone is forgotten).
func (a *Agent) limitsOf(s SliceInfo) sliceLimits {
	a.quotaMu.Lock()
	l, ok := a.limits[s.ID]
	a.quotaMu.Unlock()
	if ok {
		return l
	}
	l = limitsOfQuota(s.quota(s.Initial))
	q, err := region.ReadQuota(a.slicePath(s.ID, "quota", v1.QuotaFileName))
	if err == nil && q.SliceID == s.ID {
		l = limitsOfQuota(q)
	}
	a.quotaMu.Lock()
	defer a.quotaMu.Unlock()
	if cur, ok := a.limits[s.ID]; ok {
		return cur // applyQuota wrote a newer quota file meanwhile
	}
	a.limits[s.ID] = l
	return l
}

// usageReason is err without the path: what the sample and the audit say.
func usageReason(err error) string {
	switch {
	case errors.Is(err, region.ErrNotRegular):
		return "not a regular file"
	case errors.Is(err, region.ErrCorrupt):
		return "corrupt (wrong size or header)"
	}
	return err.Error()
}
