package metrics

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace starts every series of the broker.
const Namespace = "gpubroker"

// Label values known in advance; the series for each start at zero.
var (
	// SpawnOutcomes are the outcome label values of
	// gpubroker_spawn_duration_seconds: the spawn reached running, failed
	// (the cluster or the broker could not start it), or was refused at
	// create (quota, capacity, profile, not ready).
	SpawnOutcomes = []string{"running", "failed", "refused"}
	// PlacementRefusals are the reason label values of
	// gpubroker_placement_refusals_total: no GPU had room, a quota cap, the
	// allocations are being rebuilt, the placement was not confirmed by the
	// Redis replicas in time, and any other failure.
	PlacementRefusals = []string{"capacity", "quota", "not_ready", "not_durable", "error"}
	// RepairKinds are the kind label values of
	// gpubroker_reconcile_repairs_total (reconcile.Report's counters).
	RepairKinds = []string{"restored_server", "restored_slice", "released_slice", "deleted_pod", "deleted_secret", "settled_server", "resumed_server", "released_pod"}
	// ReclaimActions are the action label values of
	// gpubroker_reclaim_actions_total.
	ReclaimActions = []string{"warn", "shrink", "restore", "stop"}
	// ReclaimReasons are the reason label values of
	// gpubroker_reclaim_actions_total: the server was idle, reached the
	// maximum running time, or is in use again (restore).
	ReclaimReasons = []string{"idle", "max_age", "in_use"}
	// ReclaimModes are the mode label values: actions done, or only
	// decided and audited under a dry-run policy.
	ReclaimModes = []string{"enforce", "dry_run"}
	// ReclaimVerdicts and ReclaimVerdictReasons are the label values of
	// gpubroker_reclaim_decisions_total.
	ReclaimVerdicts       = []string{"active", "idle", "unknown"}
	ReclaimVerdictReasons = []string{"gpu_busy", "kernel_launch", "kernel_busy", "notebook_used", "min_running",
		"idle", "no_samples", "stale_samples", "no_sm_reading", "probe_failed"}
	// FreedActions are the action label values of the freed-GPU series.
	FreedActions = []string{"stop", "shrink"}
)

// Options configure New.
type Options struct {
	// Version is the build's version, the version label of
	// gpubroker_build_info.
	Version string
	// UserLabels turns on the per-user series (gpubroker_user_*).
	UserLabels bool
	// Profiles are the catalog's profile names, whose spawn series start
	// at zero.
	Profiles []string
}

// Broker holds the broker's series. Create it with New.
type Broker struct {
	userLabels bool

	spawn      *prometheus.HistogramVec // profile, outcome
	placement  prometheus.Histogram
	refusals   *prometheus.CounterVec // reason
	reconcile  prometheus.Histogram
	passes     *prometheus.CounterVec // result
	repairs    *prometheus.CounterVec // kind
	cycles     *prometheus.CounterVec // result
	cycleTime  prometheus.Histogram
	leader     prometheus.Gauge
	decisions  *prometheus.CounterVec // verdict, reason
	actions    *prometheus.CounterVec // action, reason, mode
	freed      *prometheus.GaugeVec   // action
	freedTotal *prometheus.CounterVec // action
	requests   *prometheus.CounterVec // method, route, code
	latency    *prometheus.HistogramVec
	streams    prometheus.Gauge
	proxied    prometheus.Gauge
	redisErrs  *prometheus.CounterVec // command
	redisCmds  *prometheus.CounterVec // command
	kubeErrs   *prometheus.CounterVec // method, code
	kubeReqs   *prometheus.CounterVec // method
	depUp      *prometheus.GaugeVec   // dependency

	fleet *fleetSeries
	pools *poolSeries
}

// New registers the broker's series, the Go runtime's and the process's
// on reg and returns them. It fails when a series is already registered
// there.
func New(reg prometheus.Registerer, o Options) (*Broker, error) {
	ns := Namespace
	b := &Broker{
		userLabels: o.UserLabels,
		spawn: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "spawn_duration_seconds",
			Help:    "Time from a server's create to the end of its spawn, by profile and outcome (running, failed, refused), seconds.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600}}, []string{"profile", "outcome"}),
		placement: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "placement_duration_seconds",
			Help:    "Time of one placement (the atomic Redis script, and the replicas' acknowledgement when waited for), placed or refused, seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "placement_refusals_total",
			Help: "Placements refused, by reason (capacity, quota, not_ready, not_durable, error)."}, []string{"reason"}),
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "reconcile_pass_duration_seconds",
			Help: "Duration of one pods-versus-Redis reconcile pass, seconds.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_passes_total",
			Help: "Reconcile passes, by result (ok, error)."}, []string{"result"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_repairs_total",
			Help: "Repairs made by reconcile passes, by kind (restored_server, restored_slice, released_slice, deleted_pod, deleted_secret, settled_server, resumed_server, released_pod)."}, []string{"kind"}),
		cycles: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reclaim_cycles_total",
			Help: "Idle-reclaim cycles this replica ran (only the Lease holder runs them), by result (ok, error)."}, []string{"result"}),
		cycleTime: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "reclaim_cycle_duration_seconds",
			Help: "Duration of one idle-reclaim cycle, seconds.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "reclaim_leader",
			Help: "1 while this replica holds the reclaimer's Lease (or runs the reclaimer without election), else 0; the holder also makes the periodic reconcile passes."}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reclaim_decisions_total",
			Help: "Running servers judged by the reclaimer, by verdict (active, idle, unknown) and reason."}, []string{"verdict", "reason"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reclaim_actions_total",
			Help: "Idle-reclaim actions, by action (warn, shrink, restore, stop), reason (idle, max_age, in_use) and mode (enforce, dry_run)."}, []string{"action", "reason", "mode"}),
		freed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "reclaim_freed_gpus",
			Help: "Guaranteed GPU compute the reclaimer holds freed at its last cycle, in GPUs (a 25 % slice is 0.25), by action: stop (servers it stopped that were not started again) and shrink (compute taken from shrunk servers)."}, []string{"action"}),
		freedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reclaim_freed_gpu_seconds_total",
			Help: "GPU time the reclaimer freed, GPU-seconds: gpubroker_reclaim_freed_gpus integrated over the cycles, by action; divide an increase by 3600 for GPU-hours."}, []string{"action"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "http_requests_total",
			Help: "API requests answered, by method, route template and status code."}, []string{"method", "route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "http_request_duration_seconds",
			Help:    "Time to answer an API request, by method, route template and status code, seconds (event streams excluded: they last as long as their client).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"method", "route", "code"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "event_streams",
			Help: "Server event streams (SSE) open on this replica."}),
		proxied: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "proxy_connections",
			Help: "Connections to notebooks the broker's proxy holds open on this replica."}),
		redisErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "redis_errors_total",
			Help: "Redis commands that failed (network, timeout or server error; a missing key is no error), by command."}, []string{"command"}),
		redisCmds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "redis_commands_total",
			Help: "Redis commands sent (each command of a pipeline or transaction counts), by command."}, []string{"command"}),
		kubeReqs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "kubernetes_requests_total",
			Help: "Kubernetes API requests sent (a watch counts once, when it opens), by HTTP method."}, []string{"method"}),
		kubeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "kubernetes_request_errors_total",
			Help: "Kubernetes API requests that failed, by HTTP method and code: 429 and 5xx answers, and \"none\" for requests that got no answer."}, []string{"method", "code"}),
		depUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "dependency_up",
			Help: "1 when the dependency answered this replica's last readiness check (every few seconds, as /readyz), else 0; by dependency (redis, kubernetes, oidc)."}, []string{"dependency"}),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
		Help: "Always 1; the version label is the broker's build."}, []string{"version"})
	build.WithLabelValues(o.Version).Set(1)
	b.fleet = newFleetSeries(o.UserLabels)
	b.pools = &poolSeries{}

	cs := []prometheus.Collector{build, b.spawn, b.placement, b.refusals, b.reconcile, b.passes, b.repairs,
		b.cycles, b.cycleTime, b.leader, b.decisions, b.actions, b.freed, b.freedTotal, b.requests, b.latency,
		b.streams, b.proxied, b.redisErrs, b.redisCmds, b.kubeErrs, b.kubeReqs, b.depUp,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
	cs = append(cs, b.fleet, b.pools)
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	b.zero(o.Profiles)
	return b, nil
}

// zero creates the series whose label values are known, at zero.
func (b *Broker) zero(profiles []string) {
	for _, p := range profiles {
		for _, o := range SpawnOutcomes {
			b.spawn.WithLabelValues(p, o)
		}
	}
	for _, r := range PlacementRefusals {
		b.refusals.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		b.passes.WithLabelValues(r)
		b.cycles.WithLabelValues(r)
	}
	for _, k := range RepairKinds {
		b.repairs.WithLabelValues(k)
	}
	for _, v := range ReclaimVerdicts {
		for _, r := range ReclaimVerdictReasons {
			if verdictHasReason(v, r) {
				b.decisions.WithLabelValues(v, r)
			}
		}
	}
	for _, a := range ReclaimActions {
		for _, r := range ReclaimReasons {
			for _, m := range ReclaimModes {
				b.actions.WithLabelValues(a, r, m)
			}
		}
	}
	for _, a := range FreedActions {
		b.freed.WithLabelValues(a)
		b.freedTotal.WithLabelValues(a)
	}
}

// verdictHasReason reports whether reason r can come with verdict v.
func verdictHasReason(v, r string) bool {
	switch r {
	case "idle":
		return v == "idle"
	case "no_samples", "stale_samples", "no_sm_reading", "probe_failed":
		return v == "unknown"
	default:
		return v == "active"
	}
}

// Handler serves the series of gatherer in the Prometheus text format
// (and OpenMetrics when asked), with errors of a scrape in the answer.
func Handler(gatherer prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// ---- servers.Metrics ----

// ObservePlacement records one placement: its duration and, for a
// refusal, its reason (one of PlacementRefusals); "" for a placement.
func (b *Broker) ObservePlacement(d time.Duration, refusal string) {
	b.placement.Observe(d.Seconds())
	if refusal != "" {
		b.refusals.WithLabelValues(refusal).Inc()
	}
}

// ObserveSpawn records a spawn that ended (outcome one of SpawnOutcomes)
// d after the server's create.
func (b *Broker) ObserveSpawn(profile, outcome string, d time.Duration) {
	b.spawn.WithLabelValues(profile, outcome).Observe(max(d, 0).Seconds())
}

// ---- reconcile.Metrics ----

// ObserveReconcile records one reconcile pass: its duration, whether it
// failed, and the repairs it made by kind (RepairKinds).
func (b *Broker) ObserveReconcile(d time.Duration, repairs map[string]int, failed bool) {
	b.reconcile.Observe(d.Seconds())
	b.passes.WithLabelValues(result(failed)).Inc()
	for kind, n := range repairs {
		if n > 0 {
			b.repairs.WithLabelValues(kind).Add(float64(n))
		}
	}
}

// ---- reclaim.Metrics ----

// ObserveCycle records one reclaim cycle and whether it failed.
func (b *Broker) ObserveCycle(d time.Duration, failed bool) {
	b.cycleTime.Observe(d.Seconds())
	b.cycles.WithLabelValues(result(failed)).Inc()
}

// ObserveDecision records one server's verdict with its reason class.
func (b *Broker) ObserveDecision(verdict, reason string) {
	b.decisions.WithLabelValues(verdict, reason).Inc()
}

// ObserveAction records one reclaim action done (or, with dryRun, only
// decided and audited).
func (b *Broker) ObserveAction(action, reason string, dryRun bool) {
	mode := "enforce"
	if dryRun {
		mode = "dry_run"
	}
	b.actions.WithLabelValues(action, reason, mode).Inc()
}

// ObserveFreed records the GPU share (in GPUs) the reclaimer holds freed
// by stops and by shrinks at a cycle, and adds it times over (the time
// since the previous cycle) to the freed GPU-seconds.
func (b *Broker) ObserveFreed(stopGPUs, shrinkGPUs float64, over time.Duration) {
	for action, v := range map[string]float64{"stop": stopGPUs, "shrink": shrinkGPUs} {
		b.freed.WithLabelValues(action).Set(v)
		if v > 0 && over > 0 {
			b.freedTotal.WithLabelValues(action).Add(v * over.Seconds())
		}
	}
}

// SetLeader records whether this replica runs the reclaimer.
func (b *Broker) SetLeader(leading bool) { b.leader.Set(boolValue(leading)) }

// ---- httpapi.Metrics ----

// ObserveRequest records one answered API request; route is the route
// template ("" for an unmatched path) and stream marks an event stream,
// which is counted but not timed.
func (b *Broker) ObserveRequest(method, route string, code int, d time.Duration, stream bool) {
	if route == "" {
		route = "unmatched"
	}
	c := strconv.Itoa(code)
	b.requests.WithLabelValues(method, route, c).Inc()
	if !stream {
		b.latency.WithLabelValues(method, route, c).Observe(d.Seconds())
	}
}

// StreamOpened and StreamClosed count the open event streams.
func (b *Broker) StreamOpened() { b.streams.Inc() }

// StreamClosed: see StreamOpened.
func (b *Broker) StreamClosed() { b.streams.Dec() }

// ProxyOpened and ProxyClosed count the requests the notebook proxy is
// forwarding (proxy.Metrics).
func (b *Broker) ProxyOpened() { b.proxied.Inc() }

// ProxyClosed: see ProxyOpened.
func (b *Broker) ProxyClosed() { b.proxied.Dec() }

// ---- readiness ----

// SetDependencyUp records a readiness check's result.
func (b *Broker) SetDependencyUp(dependency string, up bool) {
	b.depUp.WithLabelValues(dependency).Set(boolValue(up))
}

func result(failed bool) string {
	if failed {
		return "error"
	}
	return "ok"
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
