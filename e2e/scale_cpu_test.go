package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// scalePprofWindow is how long each phase profile of -scale-pprof lasts;
// it starts a second into the phase (past its ramp-up), so phases shorter
// than that come back with a partial or empty profile.
const scalePprofWindow = 6 * time.Second

// profilePhase starts, with -scale-pprof, CPU profiles of the phase that
// is about to begin: kube-apiserver's (its /debug/pprof, through the
// admin client) to DIR/apiserver-PHASE.pprof and, when broker is not nil,
// that replica's (its --debug-pprof-listen at addr) to
// DIR/broker-PHASE.pprof, each scalePprofWindow long. The returned wait
// reports the first failure once both are written; it is a no-op without
// -scale-pprof.
func profilePhase(ctx context.Context, e *env, phase, brokerAddr string) (wait func() error) {
	if *scalePprof == "" {
		return func() error { return nil }
	}
	errs := make(chan error, 2)
	n := 0
	run := func(fetch func(context.Context) ([]byte, error), file string) {
		n++
		go func() {
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				errs <- ctx.Err()
				return
			}
			fctx, cancel := context.WithTimeout(ctx, scalePprofWindow+30*time.Second)
			body, err := fetch(fctx)
			cancel()
			if err == nil {
				err = os.WriteFile(filepath.Join(*scalePprof, file), body, 0o644)
			}
			if err != nil {
				err = fmt.Errorf("profile %s: %w", file, err)
			}
			errs <- err
		}()
	}
	secs := strconv.Itoa(int(scalePprofWindow.Seconds()))
	run(func(ctx context.Context) ([]byte, error) {
		return e.cluster.Client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", secs).DoRaw(ctx)
	}, "apiserver-"+phase+".pprof")
	if brokerAddr != "" {
		run(func(ctx context.Context) ([]byte, error) {
			return getProfile(ctx, brokerAddr, scalePprofWindow)
		}, "broker-"+phase+".pprof")
	}
	return func() error {
		var all []error
		for range n {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}
}

// fetchProfile writes a CPU profile of d from the pprof listener at addr to
// dir/leader-cpu.pprof.
func fetchProfile(ctx context.Context, addr string, d time.Duration, dir string) error {
	body, err := getProfile(ctx, addr, d)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "leader-cpu.pprof"), body, 0o644)
}

// getProfile fetches a CPU profile of d (whole seconds) from the pprof
// listener at addr (a broker's --debug-pprof-listen), giving up 30 s after
// the profile should have come.
func getProfile(ctx context.Context, addr string, d time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", req.URL, resp.Status)
	}
	return io.ReadAll(resp.Body)
}
