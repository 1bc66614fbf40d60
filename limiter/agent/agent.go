package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// Defaults of Config.
const (
	DefaultSampleInterval    = time.Second
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultQuotaResync       = 30 * time.Second
	DefaultPaceInterval      = 100 * time.Millisecond
	DefaultHostRoot          = "/var/lib/gpubroker"
	DefaultProcRoot          = "/proc"
	// xidPoll bounds one wait for Xid events, so shutdown is prompt.
	xidPoll = time.Second
	// retryWait is how long a failed subscription waits before retrying.
	retryWait = 2 * time.Second
)

// Config is the agent's behaviour. Zero durations take the defaults.
type Config struct {
	// Node is the Kubernetes node name; required.
	Node string
	// HostRoot is the host directory holding <root>/slices/<id>/{quota,usage};
	// default DefaultHostRoot.
	HostRoot string
	// SampleInterval is the time between samples; default 1 s.
	SampleInterval time.Duration
	// HeartbeatInterval is the time between node reports; default 10 s.
	// The broker counts the node stale after agentstore.StaleAfter of them.
	HeartbeatInterval time.Duration
	// QuotaResync is the time between full passes over desired quotas, to
	// catch changes whose notification was missed; default 30 s.
	QuotaResync time.Duration
	// PaceInterval is the time between the pace feed's samples into the
	// usage regions (the hooks' compute controller uses samples up to
	// 500 ms old); default 100 ms; negative turns the feed off, and with
	// it the over-compute judgement (see Config.enforcement).
	PaceInterval time.Duration
	// Enforcement is the bypass policy.
	Enforcement Policy
	// MPSControl is the path of nvidia-cuda-mps-control, run for each GPU
	// in MPS mode; default DefaultMPSControl (on PATH).
	MPSControl string
	// TrustUsagePIDs maps processes that are in no pod cgroup to slices by
	// the (pid, start time) entries of the usage regions. The hooks write
	// these, so they are advisory: enable it only where processes do not
	// run in kubepods cgroups (tests, bare-metal development). Default off.
	TrustUsagePIDs bool
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Node == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	for name, d := range map[string]time.Duration{"sample interval": c.SampleInterval,
		"heartbeat interval": c.HeartbeatInterval, "quota resync": c.QuotaResync} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if m := c.Enforcement.Mode; m != "" && !m.Valid() {
		errs = append(errs, fmt.Errorf("enforcement mode must be report, kill or off, got %q", m))
	}
	if t := c.Enforcement.TolerancePercent; t < 0 || t > 100 {
		errs = append(errs, fmt.Errorf("enforcement tolerance must be 0..100 percent, got %d", t))
	}
	if m := c.Enforcement.ComputeMode; m != "" && !m.Valid() {
		errs = append(errs, fmt.Errorf("compute enforcement mode must be report, kill or off, got %q", m))
	}
	if t := c.Enforcement.ComputeTolerancePoints; t < 0 || t > 100 {
		errs = append(errs, fmt.Errorf("enforcement compute tolerance must be 0..100 percentage points, got %d", t))
	}
	if c.Enforcement.Samples < 0 {
		errs = append(errs, fmt.Errorf("enforcement samples must be >= 1, got %d", c.Enforcement.Samples))
	}
	return errors.Join(errs...)
}

// enforcement is the policy the agent enforces: Enforcement, without the
// compute judgement when the pace feed is off (the hooks of pods in their
// own pid namespace then have no SM figures to pace by, so honest slices
// would run past their ceilings).
func (c Config) enforcement() Policy {
	p := c.Enforcement
	if c.PaceInterval < 0 {
		p.ComputeMode = ModeOff
	}
	return p
}

func (c Config) withDefaults() Config {
	if c.HostRoot == "" {
		c.HostRoot = DefaultHostRoot
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.QuotaResync == 0 {
		c.QuotaResync = DefaultQuotaResync
	}
	if c.PaceInterval == 0 {
		c.PaceInterval = DefaultPaceInterval
	}
	c.Enforcement = c.Enforcement.withDefaults()
	return c
}

// Clock is the agent's time source; tests inject a fake.
type Clock interface {
	Now() time.Time
	// NewTicker returns a ticker firing every d; the caller stops it.
	NewTicker(d time.Duration) Ticker
}

// Ticker is a time.Ticker behind an interface.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// NewTicker returns a time.Ticker.
func (RealClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// PodIndex lists the slices on this node and finds a pod's slice.
type PodIndex interface {
	Slices() []SliceInfo
	ByPodUID(uid string) (SliceInfo, bool)
	// Synced reports whether the index reflects the cluster; until then
	// the agent neither samples nor enforces (every process would look like
	// one in no slice).
	Synced() bool
	// Changed receives a value when a slice appeared or changed (nil: never).
	Changed() <-chan struct{}
}

// NodeLabels reads the labels of the agent's node (implemented over
// client-go in main); the agent reads v1.LabelSharing from them.
type NodeLabels interface {
	NodeLabels(ctx context.Context) (map[string]string, error)
}

// SampleSink receives samples and node reports.
type SampleSink interface {
	AddSamples(ctx context.Context, samples []agentstore.Sample) error
	Heartbeat(ctx context.Context, r agentstore.NodeReport) error
}

// Deps are the agent's collaborators. NVML, Samples, Quotas, Audit and
// Pods are required; the others have defaults.
type Deps struct {
	// NVML is the library; Run calls Init and Shutdown on it.
	NVML nvml.Interface
	// HasSymbol reports whether the NVML library exports a function;
	// default: NVML.Extensions().LookupSymbol. Functions a library lacks are
	// never called (that would crash the process).
	HasSymbol func(name string) bool
	Samples   SampleSink
	Quotas    QuotaStore
	Audit     Auditor
	Pods      PodIndex
	// Proc is the proc(5) tree; default ProcFS{Root: "/proc"}.
	Proc ProcFS
	// Killer kills in ModeKill; default PidfdKiller on Proc.
	Killer Killer
	// Clock defaults to RealClock.
	Clock Clock
	// Wall stamps the pace feed's samples; it must be the host's
	// CLOCK_REALTIME, which the hooks compare against. Default time.Now.
	Wall func() time.Time
	// Metrics registers the agent's series; default a new registry.
	Metrics prometheus.Registerer
	// Log defaults to a discarding logger.
	Log *slog.Logger
	// NodeLabels, when set, gives the node's sharing label; nil: the GPUs
	// ask for no mode (the broker's or an admin's is kept).
	NodeLabels NodeLabels
	// Modes, when set, gives the sharing modes in force on the node's
	// GPUs (agentstore.Store.Modes); the agent runs an MPS control daemon
	// on each GPU in MPS mode. nil: no MPS daemons.
	Modes ModeSource
	// MPS runs MPS control daemons; default ExecMPS over
	// Config.MPSControl.
	MPS MPSLauncher
}

// Agent is the node agent. Build it with New and run it with Run once.
type Agent struct {
	cfg      Config
	nvml     nvml.Interface
	has      func(string) bool
	samples  SampleSink
	quotas   QuotaStore
	audit    Auditor
	pods     PodIndex
	proc     ProcFS
	killer   Killer
	clock    Clock
	wall     func() time.Time
	log      *slog.Logger
	metrics  *metrics
	enforcer *enforcer

	// Set by Run before its goroutines start.
	devs *devices
	// procCache, knownSlices and usageIDs are used by the sampling goroutine only.
	procCache   map[uint32]Process
	knownSlices map[string]bool
	usageIDs    map[string]fileID // slice → the usage file first seen

	paceMu     sync.Mutex
	paceOwners map[uint32]string   // pid → slice id, from the last sampling round
	paceSlices map[string][]string // gpu uuid → local slice ids, from the last round

	labels NodeLabels
	modes  ModeSource
	mps    MPSLauncher

	modeMu    sync.Mutex
	requested v1.SharingMode // what the node's label asks for

	guarantees *guarantees
	mpsState   *mpsState

	applyMu  sync.Mutex             // held for one applyQuota at a time
	quotaMu  sync.Mutex             // guards applied and limits
	applied  map[string]int64       // slice → desired generation applied
	limits   map[string]sliceLimits // slice → caps in effect (see limitsOf)
	computes map[string]int         // slice → guaranteed compute in effect, percent (see guaranteed)
}

// New validates cfg and returns an agent. It does no I/O and starts nothing.
func New(cfg Config, deps Deps) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if deps.NVML == nil || deps.Samples == nil || deps.Quotas == nil || deps.Audit == nil || deps.Pods == nil {
		return nil, errors.New("agent: NVML, Samples, Quotas, Audit and Pods are required")
	}
	cfg = cfg.withDefaults()
	a := &Agent{
		cfg: cfg, nvml: deps.NVML, has: deps.HasSymbol, samples: deps.Samples, quotas: deps.Quotas,
		audit: deps.Audit, pods: deps.Pods, proc: deps.Proc, killer: deps.Killer, clock: deps.Clock, wall: deps.Wall, log: deps.Log,
		labels: deps.NodeLabels, modes: deps.Modes, mps: deps.MPS, guarantees: newGuarantees(cfg.SampleInterval),
		enforcer: newEnforcer(cfg.enforcement()), procCache: map[uint32]Process{}, knownSlices: map[string]bool{}, usageIDs: map[string]fileID{},
		applied: map[string]int64{}, limits: map[string]sliceLimits{}, computes: map[string]int{}, mpsState: newMPSState(),
	}
	if a.mps == nil {
		a.mps = ExecMPS{Path: cfg.MPSControl}
	}
	if a.proc.Root == "" {
		a.proc.Root = DefaultProcRoot
	}
	if a.has == nil {
		lib := deps.NVML
		a.has = func(name string) bool { return lib.Extensions().LookupSymbol(name) == nil }
	}
	if a.killer == nil {
		a.killer = PidfdKiller{Proc: a.proc}
	}
	if a.clock == nil {
		a.clock = RealClock{}
	}
	if a.wall == nil {
		a.wall = wallNow
	}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	reg := deps.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("agent metrics: %w", err)
	}
	a.metrics = m
	return a, nil
}

// Run initializes NVML, discovers the GPUs, and then samples, heartbeats,
// applies quotas and watches Xid events until ctx ends; it shuts NVML down
// after every goroutine has returned. It returns nil after ctx ends, or the
// error that stopped it (NVML init or discovery failing entirely). A device
// that fails discovery is reported unhealthy, not fatal.
func (a *Agent) Run(ctx context.Context) (rerr error) {
	if ret := a.nvml.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml init: %w", ret)
	}
	defer func() {
		if ret := a.nvml.Shutdown(); ret != nvml.SUCCESS && rerr == nil {
			rerr = fmt.Errorf("nvml shutdown: %w", ret)
		}
	}()
	devs, err := discoverDevices(a.nvml, a.cfg.Node, a.has, a.clock.Now())
	if devs == nil {
		return fmt.Errorf("discover gpus: %w", err)
	}
	if err != nil {
		a.log.WarnContext(ctx, "some gpus failed discovery and are reported unhealthy", "err", err)
	}
	a.devs = devs
	for _, g := range devs.reports() {
		a.metrics.gpuMemTotal.WithLabelValues(g.UUID).Set(float64(g.MemoryMiB) * mib)
		a.metrics.healthy.WithLabelValues(g.UUID).Set(boolGauge(g.Healthy))
		a.log.InfoContext(ctx, "gpu discovered", "gpu_uuid", g.UUID, "model", g.Model, "mem_mib", g.MemoryMiB,
			"sm_count", g.SMCount, "healthy", g.Healthy, "reason", g.Reason, "mig", g.MIGEnabled)
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.sampleLoop(ctx) })
	g.Go(func() error { return a.heartbeatLoop(ctx) })
	g.Go(func() error { return a.quotaLoop(ctx) })
	g.Go(func() error { return a.watchLoop(ctx) })
	g.Go(func() error { return a.mpsLoop(ctx) })
	if a.cfg.PaceInterval > 0 {
		g.Go(func() error { return a.paceLoop(ctx) })
	}
	g.Go(func() error {
		if err := a.watchXids(ctx, xidPoll); err != nil {
			// Health then comes from NVML errors while sampling; not fatal.
			a.metrics.errors.WithLabelValues("xid").Inc()
			a.log.WarnContext(ctx, "xid watch stopped", "err", err)
		}
		return nil
	})
	return g.Wait()
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// sampleLoop samples every SampleInterval until ctx ends.
func (a *Agent) sampleLoop(ctx context.Context) error {
	return a.every(ctx, a.cfg.SampleInterval, a.SampleOnce)
}

// every calls round at each tick of the agent's clock, every interval,
// until ctx ends; it returns nil then.
func (a *Agent) every(ctx context.Context, interval time.Duration, round func(context.Context)) error {
	t := a.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			round(ctx)
		}
	}
}

// SampleOnce runs one sampling round: samples into the sink, metrics,
// enforcement. Failures are logged and counted (this is the loop's edge);
// the next round retries. Only one SampleOnce may run at a time, and only
// after Run has discovered the devices.
func (a *Agent) SampleOnce(ctx context.Context) {
	if !a.pods.Synced() {
		a.log.DebugContext(ctx, "pod index not synced; round skipped")
		return
	}
	start := time.Now()
	r := a.sampleRound(ctx)
	a.setPaceOwners(r)
	samples := make([]agentstore.Sample, 0, len(r.Slices))
	live := make(map[string]bool, len(r.Slices))
	for _, s := range r.Slices {
		samples = append(samples, s.Sample)
		live[s.Info.ID] = true
		a.knownSlices[s.Info.ID] = true
		a.metrics.sliceLimit.WithLabelValues(s.Info.ID, s.Info.GPU).Set(float64(s.LimitBytes))
		if s.Sample.MemoryUsedMiB != nil {
			a.metrics.sliceMem.WithLabelValues(s.Info.ID, s.Info.GPU).Set(float64(s.UsedBytes))
		}
		if s.Sample.SMPercent != nil {
			a.metrics.sliceSM.WithLabelValues(s.Info.ID, s.Info.GPU).Set(float64(*s.Sample.SMPercent))
		}
	}
	for id := range a.knownSlices {
		if !live[id] {
			delete(a.knownSlices, id)
			delete(a.usageIDs, id)
			a.quotaMu.Lock()
			delete(a.limits, id)
			delete(a.computes, id)
			a.quotaMu.Unlock()
			a.guarantees.forget(id)
			a.metrics.forgetSlice(id)
			if f, ok := a.samples.(interface{ Forget(string) }); ok {
				f.Forget(id)
			}
		}
	}
	if err := a.samples.AddSamples(ctx, samples); err != nil {
		a.metrics.errors.WithLabelValues("redis").Inc()
		a.log.WarnContext(ctx, "samples not written", "err", err, "samples", len(samples))
	} else {
		for _, s := range samples {
			a.metrics.sliceAt.WithLabelValues(s.Slice).Set(float64(s.At.UnixMilli()) / 1000)
		}
	}
	if err := a.enforce(ctx, r); err != nil {
		a.metrics.errors.WithLabelValues("redis").Inc()
		a.log.WarnContext(ctx, "audit records not written", "err", err)
	}
	a.metrics.rounds.Observe(time.Since(start).Seconds())
}

// The implementations main wires in.
var (
	_ PodIndex   = (*PodWatcher)(nil)
	_ PodIndex   = StaticPods(nil)
	_ SampleSink = (*agentstore.Store)(nil)
	_ QuotaStore = (*agentstore.Store)(nil)
	_ Auditor    = (*agentstore.Store)(nil)
	_ Clock      = RealClock{}
)
