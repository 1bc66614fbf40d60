package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// device is one GPU the agent manages. Its health fields are guarded by
// devices.mu; nvml handles are used from the sampling goroutine only, and
// from the Xid goroutine for registration before sampling starts.
type device struct {
	index  int
	handle nvml.Device
	report agentstore.GPUReport
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
	}
	return ds, errors.Join(errs...)
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
		d.report.Healthy = false
		d.report.Reason = "mig mode is enabled; gpubroker slices need a whole GPU"
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
// recovery needs a GPU reset that drains its processes anyway.
func (ds *devices) markLost(d *device, reason string, now time.Time) bool {
	ds.mu.Lock()
	if !d.report.Healthy {
		ds.mu.Unlock()
		return false
	}
	d.report.Healthy = false
	d.report.Reason = reason
	d.report.Since = now
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
		ret := d.handle.RegisterEvents(nvml.EventTypeXidCriticalError, set)
		switch {
		case ret == nvml.SUCCESS:
			registered++
		case ret == nvml.ERROR_NOT_SUPPORTED:
			a.log.InfoContext(ctx, "xid events not supported", "gpu_uuid", d.report.UUID)
		case lostReturn(ret):
			a.devs.markLost(d, "gpu lost: register xid events: "+ret.Error(), a.clock.Now())
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
		a.log.WarnContext(ctx, "gpu marked unhealthy", "gpu_uuid", d.report.UUID, "reason", reason)
		a.metrics.healthy.WithLabelValues(d.report.UUID).Set(0)
	}
}
