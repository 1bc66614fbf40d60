package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// device is one GPU the agent manages. Its health fields are guarded by
// devices.mu; nvml handles are used from the sampling goroutine only, and
// from the Xid goroutine for registration before sampling starts.
type device struct {
	index  int
	handle nvml.Device
	report agentstore.GPUReport
	// parent is a MIG instance's GPU (whose handle is a MIG device handle);
	// nil for a GPU. instances are a MIG-mode GPU's instances.
	parent    *device
	instances []*device
	// lastSeenUs is the newest process-utilization timestamp seen
	// (microseconds, NVML's clock); only the sampler touches it.
	lastSeenUs uint64
	// paceSeenUs and pace are the pace feed's own cursor and per-pid
	// state; only the pace goroutine touches them.
	paceSeenUs uint64
	pace       map[uint32]*paceHold
}

// devices is the node's GPU set with their health. Safe for concurrent use.
type devices struct {
	mu   sync.Mutex
	list []*device
	// changed receives a value (without blocking) when a device's health
	// changes, so the heartbeat loop reports it at once.
	changed chan struct{}
}

// discoverDevices describes every device NVML sees; see Discover. has
// reports whether the loaded NVML exports a symbol (drivers and the test
// stub may lack newer ones; calling a missing symbol would crash).
func discoverDevices(lib nvml.Interface, node string, has func(string) bool, now time.Time) (*devices, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("device count: %w", ret)
	}
	ds := &devices{changed: make(chan struct{}, 1)}
	var errs []error
	for i := 0; i < n; i++ {
		d, err := describeDevice(lib, i, node, has, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %d: %w", i, err))
			if d == nil {
				continue
			}
		}
		ds.list = append(ds.list, d)
		if d.report.MIGEnabled {
			insts, err := describeInstances(d, has, now)
			if err != nil {
				errs = append(errs, fmt.Errorf("device %d: %w", i, err))
			}
			d.instances = insts
			ds.list = append(ds.list, insts...)
		}
	}
	return ds, errors.Join(errs...)
}

// migSymbols are the NVML functions MIG discovery needs.
var migSymbols = []string{"nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
	"nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetAttributes_v2"}

// describeInstances lists the MIG instances of the MIG-mode GPU g through
// NVML's MIG device handles (one per compute instance): UUID ("MIG-…"),
// MIG profile, memory, SM count, and their GPU and compute instance ids.
// A slot without an instance (ERROR_NOT_FOUND) is skipped; an instance
// that fails a query is left out with the error. An instance's health is
// its GPU's.
func describeInstances(g *device, has func(string) bool, now time.Time) ([]*device, error) {
	for _, sym := range migSymbols {
		if !has(sym) {
			return nil, fmt.Errorf("gpu %s is in MIG mode, but NVML lacks %s: its MIG instances cannot be listed", g.report.UUID, sym)
		}
	}
	n, ret := g.handle.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu %s: max MIG device count: %w", g.report.UUID, ret)
	}
	var out []*device
	var errs []error
	for i := 0; i < n; i++ {
		h, ret := g.handle.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no instance in this slot
		}
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("gpu %s: MIG device %d: %w", g.report.UUID, i, ret))
			continue
		}
		inst, err := describeInstance(g, h, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("gpu %s: MIG device %d: %w", g.report.UUID, i, err))
			continue
		}
		out = append(out, inst)
	}
	return out, errors.Join(errs...)
}

// describeInstance describes one MIG device handle h of GPU g.
func describeInstance(g *device, h nvml.Device, now time.Time) (*device, error) {
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("uuid: %w", ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: memory info: %w", uuid, ret)
	}
	attrs, ret := h.GetAttributes()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: attributes: %w", uuid, ret)
	}
	gi, ret := h.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: gpu instance id: %w", uuid, ret)
	}
	ci, ret := h.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: compute instance id: %w", uuid, ret)
	}
	name, _ := h.GetName() // e.g. "NVIDIA H200 MIG 3g.71gb"; only a hint
	sms := int(attrs.MultiprocessorCount)
	if sms <= 0 {
		return nil, fmt.Errorf("%s: NVML reports %d SMs", uuid, sms)
	}
	share := 100
	if g.report.SMCount > 0 {
		share = min(max((100*sms+g.report.SMCount/2)/g.report.SMCount, 1), 100)
	}
	return &device{index: g.index, handle: h, parent: g, report: agentstore.GPUReport{
		GPU: v1.GPU{UUID: uuid, Node: g.report.Node, Model: g.report.Model, MemoryMiB: int64(mem.Total >> 20), SMCount: sms,
			Healthy: g.report.Healthy, Mode: v1.SharingMIG, MIGProfile: migProfileName(name, attrs),
			ParentUUID: g.report.UUID, ComputePercent: share},
		GPUInstanceID: gi, ComputeInstanceID: ci, Reason: g.report.Reason, Since: now,
	}}, nil
}

// migProfileName is a MIG device's profile: the name NVML gives the
// device ("NVIDIA H100 80GB HBM3 MIG 3g.40gb" → "3g.40gb"), or, when the
// name carries none, one made from its attributes as NVIDIA names them:
// GPU-instance slices, "g.", memory in whole GB, "gb", with "<n>c." first
// for a compute instance smaller than its GPU instance. The made-up form
// matches NVIDIA's where memory is a whole number of GiB (the profiles of
// go-nvml's mocks); real drivers name every device.
func migProfileName(name string, a nvml.DeviceAttributes) string {
	if i := strings.LastIndex(name, "MIG "); i >= 0 {
		if p := strings.TrimSpace(name[i+len("MIG "):]); p != "" {
			return p
		}
	}
	p := fmt.Sprintf("%dg.%dgb", a.GpuInstanceSliceCount, (a.MemorySizeMB+512)/1024)
	if a.ComputeInstanceSliceCount > 0 && a.ComputeInstanceSliceCount < a.GpuInstanceSliceCount {
		p = fmt.Sprintf("%dc.%s", a.ComputeInstanceSliceCount, p)
	}
	return p
}

func describeDevice(lib nvml.Interface, index int, node string, has func(string) bool, now time.Time) (*device, error) {
	h, ret := lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("handle: %w", ret)
	}
	g, err := describe(lib, index, node)
	if g.UUID == "" {
		return nil, err
	}
	if errors.Is(err, ErrUnknownModel) && has("nvmlDeviceGetAttributes_v2") {
		// A model missing from the table: NVML reports the SM count of a
		// whole GPU through its attributes on recent drivers.
		if attrs, ret := h.GetAttributes(); ret == nvml.SUCCESS && attrs.MultiprocessorCount > 0 {
			g.SMCount, g.Healthy, err = int(attrs.MultiprocessorCount), true, nil
		}
	}
	d := &device{index: index, handle: h, report: agentstore.GPUReport{GPU: g, Since: now}}
	if err != nil {
		d.report.Healthy = false
		d.report.Reason = err.Error()
		return d, err
	}
	if has("nvmlDeviceGetMigMode") {
		cur, _, ret := h.GetMigMode()
		switch ret {
		case nvml.SUCCESS:
			d.report.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
		case nvml.ERROR_NOT_SUPPORTED:
			// Not a MIG-capable board: whole-GPU slices as usual.
		default:
			d.report.Healthy = false
			d.report.Reason = fmt.Sprintf("mig mode: %s", ret.Error())
			return d, fmt.Errorf("gpu %s: mig mode: %w", g.UUID, ret)
		}
	}
	if d.report.MIGEnabled {
		// Placed through its instances (describeInstances), not itself.
		d.report.Mode = v1.SharingMIG
	}
	return d, nil
}

// reports returns a copy of every device's report, in index order.
func (ds *devices) reports() []agentstore.GPUReport {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	out := make([]agentstore.GPUReport, len(ds.list))
	for i, d := range ds.list {
		out[i] = d.report
	}
	return out
}

// healthy reports whether d is healthy, and if not, why.
func (ds *devices) healthy(d *device) (bool, string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return d.report.Healthy, d.report.Reason
}

// markLost marks d unhealthy with reason (first reason wins) and signals
// the change. A lost device stays unhealthy until the agent restarts, as
// recovery needs a GPU reset that drains its processes anyway. A MIG
// instance is lost with its GPU: marking either marks the GPU and all its
// instances, and nothing else.
func (ds *devices) markLost(d *device, reason string, now time.Time) bool {
	if d.parent != nil {
		d = d.parent
	}
	ds.mu.Lock()
	if !d.report.Healthy {
		ds.mu.Unlock()
		return false
	}
	for _, x := range append([]*device{d}, d.instances...) {
		x.report.Healthy = false
		x.report.Reason = reason
		x.report.Since = now
	}
	ds.mu.Unlock()
	select {
	case ds.changed <- struct{}{}:
	default:
	}
	return true
}

// byUUID finds a device by UUID; nil when unknown.
func (ds *devices) byUUID(uuid string) *device {
	i := slices.IndexFunc(ds.list, func(d *device) bool { return d.report.UUID == uuid })
	if i < 0 {
		return nil
	}
	return ds.list[i]
}

// lostReturn reports whether an NVML result means the device is gone.
func lostReturn(r nvml.Return) bool {
	return r == nvml.ERROR_GPU_IS_LOST || r == nvml.ERROR_RESET_REQUIRED
}

// applicationXids are Xid codes caused by the application, not the device
// (the list NVIDIA's k8s-device-plugin skips): 13 graphics engine
// exception, 31 memory page fault, 43 stopped channel, 45 preemptive
// cleanup, 68 video processor exception, 109 context switch timeout.
var applicationXids = []uint64{13, 31, 43, 45, 68, 109}

// xidSymbols are the NVML functions the Xid watcher needs.
var xidSymbols = []string{"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree"}

// watchXids waits for critical Xid events on every device and marks the
// device of each non-application Xid unhealthy, until ctx ends. It returns
// nil at once when the library lacks the event API or no device supports
// Xid events; then health comes from NVML errors during sampling only.
// poll bounds each wait so that ctx is honored.
func (a *Agent) watchXids(ctx context.Context, poll time.Duration) error {
	for _, s := range xidSymbols {
		if !a.has(s) {
			a.log.InfoContext(ctx, "xid events unavailable; device health comes from nvml errors", "symbol", s)
			return nil
		}
	}
	set, ret := a.nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("xid event set: %w", ret)
	}
	defer set.Free()
	registered := 0
	for _, d := range a.devs.list {
		if d.parent != nil {
			continue // a MIG instance's Xids are its GPU's
		}
		ret := d.handle.RegisterEvents(nvml.EventTypeXidCriticalError, set)
		switch {
		case ret == nvml.SUCCESS:
			registered++
		case ret == nvml.ERROR_NOT_SUPPORTED:
			a.log.InfoContext(ctx, "xid events not supported", "gpu_uuid", d.report.UUID)
		case lostReturn(ret):
			a.lose(ctx, d, "gpu lost: register xid events: "+ret.Error(), a.clock.Now())
		default:
			return fmt.Errorf("gpu %s: register xid events: %w", d.report.UUID, ret)
		}
	}
	if registered == 0 {
		return nil
	}
	for ctx.Err() == nil {
		e, ret := set.Wait(uint32(poll.Milliseconds()))
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			return fmt.Errorf("wait for xid events: %w", ret)
		}
		a.onXid(ctx, e)
	}
	return nil
}

// onXid handles one event from the Xid set.
func (a *Agent) onXid(ctx context.Context, e nvml.EventData) {
	if e.EventType != nvml.EventTypeXidCriticalError || slices.Contains(applicationXids, e.EventData) {
		return
	}
	var d *device
	if e.Device != nil {
		if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
			d = a.devs.byUUID(uuid)
		}
	}
	reason := fmt.Sprintf("xid %d", e.EventData)
	if d == nil {
		// NVML could not say which device: the error is not attributable to
		// one GPU, so none is marked (marking all would take the node down
		// for one unknown event). Logged for the operator.
		a.log.WarnContext(ctx, "xid event for an unknown device", "xid", e.EventData)
		return
	}
	if a.devs.markLost(d, reason, a.clock.Now()) {
		a.lost(ctx, d, reason)
	}
}
