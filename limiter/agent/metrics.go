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
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "gpubroker_agent"
	m := &metrics{
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "gpu_healthy",
			Help: "1 when the GPU is healthy, 0 when lost (Xid or NVML error) or MIG-enabled."}, []string{"gpu"}),
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
			Help: "Enforcement actions by action (report, kill, kill-failed) and reason (over-memory, no-slice)."}, []string{"action", "reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Errors by stage (nvml, proc, redis, quota, xid)."}, []string{"stage"}),
		rounds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "sample_round_seconds",
			Help: "Duration of one sampling round over all GPUs, seconds.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12)}),
	}
	for _, c := range []prometheus.Collector{m.healthy, m.gpuMemUsed, m.gpuMemTotal, m.gpuSM, m.sliceMem,
		m.sliceLimit, m.sliceSM, m.sliceAt, m.actions, m.errors, m.rounds} {
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
	m.sliceAt.DeleteLabelValues(slice)
}
