package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's Prometheus series. Per-slice series are deleted
// when the slice leaves the node.
type metrics struct {
	healthy     *prometheus.GaugeVec   // gpu
	gpuMemUsed  *prometheus.GaugeVec   // gpu; bytes
	gpuMemTotal *prometheus.GaugeVec   // gpu; bytes
	gpuSM       *prometheus.GaugeVec   // gpu; percent
	sliceMem    *prometheus.GaugeVec   // slice, gpu; bytes
	sliceLimit  *prometheus.GaugeVec   // slice, gpu; bytes
	sliceSM     *prometheus.GaugeVec   // slice, gpu; percent
	sliceAt     *prometheus.GaugeVec   // slice; Unix seconds of the last sample written
	actions     *prometheus.CounterVec // action, reason
	errors      *prometheus.CounterVec // stage
	rounds      prometheus.Histogram   // seconds per sampling round
	mpsUp       *prometheus.GaugeVec   // gpu
	mpsRestarts *prometheus.CounterVec // gpu
	// Promised vs delivered (guarantee.go), per slice and gpu.
	guaranteeRatio   *prometheus.GaugeVec
	guaranteePercent *prometheus.GaugeVec
	guaranteeWanted  *prometheus.CounterVec
	guaranteeMet     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "gpubroker_agent"
	m := &metrics{
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "gpu_healthy",
			Help: "1 when the device (a GPU or a MIG instance) is healthy, 0 when lost (Xid or NVML error; a MIG instance with its GPU)."}, []string{"gpu"}),
		gpuMemUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "gpu_memory_used_bytes",
			Help: "Device memory of all compute processes on the GPU, bytes (NVML)."}, []string{"gpu"}),
		gpuMemTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "gpu_memory_total_bytes",
			Help: "Total device memory of the GPU, bytes."}, []string{"gpu"}),
		gpuSM: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "gpu_sm_utilization_percent",
			Help: "SM utilization of the GPU over the last interval, percent (sum over processes)."}, []string{"gpu"}),
		sliceMem: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "slice_memory_used_bytes",
			Help: "Device memory of the slice's processes, bytes (NVML)."}, []string{"slice", "gpu"}),
		sliceLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "slice_memory_limit_bytes",
			Help: "Memory cap in effect for the slice, bytes."}, []string{"slice", "gpu"}),
		sliceSM: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "slice_sm_utilization_percent",
			Help: "SM utilization of the slice over the last interval, percent of the GPU."}, []string{"slice", "gpu"}),
		sliceAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "slice_last_sample_timestamp_seconds",
			Help: "Unix time of the slice's last sample written to Redis; sample age is time() minus this."}, []string{"slice"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "enforcement_actions_total",
			Help: "Enforcement actions by action (report, kill, kill-failed) and reason (over-memory, over-compute, hidden, no-slice, usage-tampered)."}, []string{"action", "reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Errors by stage (nvml, proc, redis, quota, xid, kube, mps)."}, []string{"stage"}),
		rounds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "sample_round_seconds",
			Help: "Duration of one sampling round over all GPUs, seconds.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12)}),
	}
	m.mpsUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "mps_daemon_up",
		Help: "1 while the GPU's MPS control daemon runs with its client limits set, 0 while it is being (re)started."}, []string{"gpu"})
	m.mpsRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mps_daemon_restarts_total",
		Help: "Times the GPU's MPS control daemon died and was started again."}, []string{"gpu"})
	m.guaranteeRatio = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "guarantee_met_ratio",
		Help: "Share of the last hour's time in which the slice asked for its guaranteed compute (the hook throttled it, or it launched continuously) that it received it (SM share >= 90 % of the guarantee), 0..1; absent while it never asked."}, []string{"slice", "gpu"})
	m.guaranteePercent = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "guarantee_percent",
		Help: "The slice's guaranteed compute, percent of the GPU's SMs."}, []string{"slice", "gpu"})
	m.guaranteeWanted = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "guarantee_wanted_seconds_total",
		Help: "Time the slice asked for its guaranteed compute, seconds (sampling windows with work waiting)."}, []string{"slice", "gpu"})
	m.guaranteeMet = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "guarantee_met_seconds_total",
		Help: "Of guarantee_wanted_seconds_total, the time the slice received its guarantee, seconds."}, []string{"slice", "gpu"})
	for _, c := range []prometheus.Collector{m.healthy, m.gpuMemUsed, m.gpuMemTotal, m.gpuSM, m.sliceMem,
		m.sliceLimit, m.sliceSM, m.sliceAt, m.actions, m.errors, m.rounds, m.mpsUp, m.mpsRestarts,
		m.guaranteeRatio, m.guaranteePercent, m.guaranteeWanted, m.guaranteeMet} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// forgetSlice deletes a slice's series.
func (m *metrics) forgetSlice(slice string) {
	m.sliceMem.DeletePartialMatch(prometheus.Labels{"slice": slice})
	m.sliceLimit.DeletePartialMatch(prometheus.Labels{"slice": slice})
	m.sliceSM.DeletePartialMatch(prometheus.Labels{"slice": slice})
	for _, v := range []*prometheus.MetricVec{m.guaranteeRatio.MetricVec, m.guaranteePercent.MetricVec,
		m.guaranteeWanted.MetricVec, m.guaranteeMet.MetricVec} {
		v.DeletePartialMatch(prometheus.Labels{"slice": slice})
	}
	m.sliceAt.DeleteLabelValues(slice)
}
