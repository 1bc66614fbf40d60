package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MiB is the number of bytes in a MiB; the fleet's sizes are MiB, the
// series are bytes.
const MiB = 1 << 20

// Fleet is the state SetFleet exports: what Redis holds, as one replica
// read it.
type Fleet struct {
	GPUs    []GPU
	Servers []Server
	// Nodes are the node agents' last heartbeats.
	Nodes []Node
}

// GPU is one registered GPU with what is allocated on it.
type GPU struct {
	UUID, Node, Model string
	// MemoryMiB is its allocatable memory; AllocatedMiB Σ slice memory.
	MemoryMiB, AllocatedMiB int64
	// AllocatedComputePercent is Σ guaranteed compute, 0..100.
	AllocatedComputePercent int
	Slices                  int
	Healthy                 bool
}

// Server is one server record: its user, state and profile, and its
// slice when it holds one.
type Server struct {
	User, State, Profile string
	// MemoryMiB and ComputePercent are its slice while it holds one (0
	// otherwise).
	MemoryMiB      int64
	ComputePercent int
}

// Node is one node agent's last heartbeat.
type Node struct {
	Name          string
	LastHeartbeat time.Time
}

// fleetSeries exports the last Fleet given to SetFleet, built at each
// scrape from that one snapshot, so a scrape never sees half of an update
// and GPUs, states, nodes and users that are gone have no series.
type fleetSeries struct {
	userLabels bool

	servers, gpuMem, gpuAlloc, gpuCompute, gpuSlices, gpuHealthy, nodeReport *prometheus.Desc
	userServers, userMem, userCompute                                        *prometheus.Desc

	mu   sync.Mutex
	last Fleet
}

func newFleetSeries(userLabels bool) *fleetSeries {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
	}
	return &fleetSeries{
		userLabels:  userLabels,
		servers:     desc("servers", "Server records by lifecycle state and profile (stopped and failed ones while Redis keeps them).", "state", "profile"),
		gpuMem:      desc("gpu_memory_capacity_bytes", "Allocatable device memory of each registered GPU, bytes.", "gpu", "node", "model"),
		gpuAlloc:    desc("gpu_memory_allocated_bytes", "Device memory allocated to slices on each GPU, bytes (Σ slice memory caps).", "gpu", "node"),
		gpuCompute:  desc("gpu_compute_allocated_percent", "Guaranteed compute allocated to slices on each GPU, percent of the GPU (capacity is 100).", "gpu", "node"),
		gpuSlices:   desc("gpu_slices", "Slices allocated on each GPU.", "gpu", "node"),
		gpuHealthy:  desc("gpu_healthy", "1 when the GPU takes new slices (healthy, its agent reporting), else 0.", "gpu", "node"),
		nodeReport:  desc("node_last_report_timestamp_seconds", "Unix time of the node agent's last heartbeat in Redis, as the broker reads it; its age is time() minus this.", "node"),
		userServers: desc("user_servers", "Server records by user and state (only with --metrics-user-labels).", "user", "state"),
		userMem:     desc("user_gpu_memory_allocated_bytes", "Device memory allocated to the user's slices, bytes (only with --metrics-user-labels).", "user"),
		userCompute: desc("user_gpu_compute_allocated_percent", "Guaranteed compute allocated to the user's slices, percent of one GPU (only with --metrics-user-labels).", "user"),
	}
}

// Describe implements prometheus.Collector.
func (f *fleetSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{f.servers, f.gpuMem, f.gpuAlloc, f.gpuCompute, f.gpuSlices, f.gpuHealthy, f.nodeReport} {
		ch <- d
	}
	if f.userLabels {
		ch <- f.userServers
		ch <- f.userMem
		ch <- f.userCompute
	}
}

// Collect implements prometheus.Collector.
func (f *fleetSeries) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	fl := f.last
	f.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, g := range fl.GPUs {
		gauge(f.gpuMem, float64(g.MemoryMiB)*MiB, g.UUID, g.Node, g.Model)
		gauge(f.gpuAlloc, float64(g.AllocatedMiB)*MiB, g.UUID, g.Node)
		gauge(f.gpuCompute, float64(g.AllocatedComputePercent), g.UUID, g.Node)
		gauge(f.gpuSlices, float64(g.Slices), g.UUID, g.Node)
		gauge(f.gpuHealthy, boolValue(g.Healthy), g.UUID, g.Node)
	}
	type stateProfile struct{ state, profile string }
	type userState struct{ user, state string }
	type use struct {
		mib     int64
		compute int
	}
	byState := map[stateProfile]int{}
	byUser := map[userState]int{}
	userUse := map[string]use{}
	for _, s := range fl.Servers {
		byState[stateProfile{s.State, s.Profile}]++
		if f.userLabels {
			byUser[userState{s.User, s.State}]++
			u := userUse[s.User]
			u.mib += s.MemoryMiB
			u.compute += s.ComputePercent
			userUse[s.User] = u
		}
	}
	for k, n := range byState {
		gauge(f.servers, float64(n), k.state, k.profile)
	}
	for k, n := range byUser {
		gauge(f.userServers, float64(n), k.user, k.state)
	}
	for user, u := range userUse {
		gauge(f.userMem, float64(u.mib)*MiB, user)
		gauge(f.userCompute, float64(u.compute), user)
	}
	for _, n := range fl.Nodes {
		gauge(f.nodeReport, float64(n.LastHeartbeat.UnixMilli())/1000, n.Name)
	}
}

// SetFleet replaces the fleet the next scrapes export.
func (b *Broker) SetFleet(fl Fleet) {
	b.fleet.mu.Lock()
	b.fleet.last = fl
	b.fleet.mu.Unlock()
}
