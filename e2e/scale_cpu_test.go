package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// cpuParts are the parts partCPU measures, in the order they are printed.
var cpuParts = []string{"kube-apiserver", "etcd", "kwok", "brokers", "redis-server", "rig", "machine"}

// partCPU is the CPU seconds so far of each part of the rig: the cluster's
// processes, the brokers together, redis-server (INFO cpu), this test
// process (the load and its watches) and the whole machine, which also
// counts whatever else runs on it.
func partCPU(tb testing.TB, e *env, replicas []*harness.Broker) map[string]float64 {
	tb.Helper()
	out := map[string]float64{}
	pids := e.cluster.Pids()
	for _, name := range []string{"kube-apiserver", "etcd", "kwok"} {
		c, err := harness.ProcCPU(pids[name])
		if err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
		out[name] = c
	}
	for _, c := range replicaCPU(tb, replicas) {
		out["brokers"] += c
	}
	self, err := harness.ProcCPU(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	out["rig"] = self
	if out["machine"], err = harness.MachineCPU(); err != nil {
		tb.Fatal(err)
	}
	if e.redis == nil {
		return out // an outside Redis: not this rig's to measure
	}
	info, err := e.redis.Client(tb).Info(tb.Context(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("redis INFO cpu %s: %v", k, err)
			}
			out["redis-server"] += f
		}
	}
	return out
}

// cpuSince is partCPU now minus at.
func cpuSince(tb testing.TB, e *env, replicas []*harness.Broker, at map[string]float64) map[string]float64 {
	tb.Helper()
	now := partCPU(tb, e, replicas)
	for k := range now {
		now[k] -= at[k]
	}
	return now
}

// replicaCPU is each replica's CPU seconds so far.
func replicaCPU(tb testing.TB, replicas []*harness.Broker) []float64 {
	tb.Helper()
	out := make([]float64, len(replicas))
	for i, b := range replicas {
		c, err := harness.ProcCPU(b.Pid())
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = c
	}
	return out
}
