package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// The cost benchmark's shape: an idle window, then creates at a steady
// rate through the broker, then the same pod creates by a plain client-go
// program, all on one cluster in one run.
const (
	costIdle    = 10 * time.Second
	costRate    = 50 // creates per second
	costCreates = 500
	// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100
	// on every Linux architecture Go supports.
	clockTicks = 100
)

// rawCreatorEnv makes the test binary the plain client-go pod creator
// (runRawCreator) instead of running tests; its value is the JSON of a
// rawCreatorJob.
const rawCreatorEnv = "E2E_RAW_POD_CREATOR"

// rawCreatorJob is what the plain creator does.
type rawCreatorJob struct {
	Kubeconfig string   `json:"kubeconfig"`
	Namespace  string   `json:"namespace"`
	Nodes      []string `json:"nodes"`
	Count      int      `json:"count"`
	Rate       int      `json:"rate"`
}

// rawCreatorResult is what it reports on stdout: its own CPU time and peak
// RSS (getrusage).
type rawCreatorResult struct {
	CPUSeconds float64 `json:"cpuSeconds"`
	MaxRSSKiB  int64   `json:"maxRssKiB"`
	Wall       float64 `json:"wallSeconds"`
}

// BenchmarkBrokerCost measures the broker's CPU and resident memory at
// idle (no requests, the reconciler, inventory, readiness and metrics
// loops running) and under costRate creates per second (each create a
// notebook pod that kwok runs), next to a plain client-go program that
// creates the same number of pods at the same rate and watches them run,
// in one run on one cluster, and prints the ratios.
//
//	go test -run='^$' -bench=BrokerCost -benchtime=1x ./e2e/
func BenchmarkBrokerCost(b *testing.B) {
	e := newEnv(b, envOptions{nodes: spawnNodes, gpusPerNode: spawnGPUs, profiles: spawnProfiles})
	ctx := b.Context()
	pid := e.broker.Pid()
	b.ResetTimer()
	for round := range b.N {
		idle, err := measure(ctx, pid, func(ctx context.Context) error {
			select {
			case <-time.After(costIdle): // the idle window itself is what is measured
			case <-ctx.Done():
			}
			return ctx.Err()
		})
		if err != nil {
			b.Fatal(err)
		}
		clients := make([]*harness.Client, spawnClients)
		for i := range clients {
			clients[i] = e.client(fmt.Sprintf("bench%d", i), "ml")
		}
		load, err := measure(ctx, pid, func(ctx context.Context) error { return brokerCreates(ctx, e, clients, round) })
		if err != nil {
			b.Fatal(err)
		}
		raw, err := rawCreates(ctx, e, round)
		if err != nil {
			b.Fatal(err)
		}
		rawCores := raw.CPUSeconds / raw.Wall
		rawMiB := float64(raw.MaxRSSKiB) / 1024
		b.ReportMetric(idle.cores(), "broker-idle-cpu-cores")
		b.ReportMetric(idle.rssMiB(), "broker-idle-rss-MiB")
		b.ReportMetric(load.cores(), "broker-load-cpu-cores")
		b.ReportMetric(load.rssMiB(), "broker-load-rss-MiB")
		b.ReportMetric(rawCores, "raw-cpu-cores")
		b.ReportMetric(rawMiB, "raw-rss-MiB")
		b.ReportMetric(load.cpu/raw.CPUSeconds, "cpu-ratio")
		b.ReportMetric(load.rssMiB()/rawMiB, "rss-ratio")
		b.Logf("broker idle %s: %.3f cores, RSS %.1f MiB", costIdle, idle.cores(), idle.rssMiB())
		b.Logf("broker, %d creates at %d/s until all run (%.1f s): %.3f cores (%.2f CPU-ms per create), RSS %.1f MiB",
			costCreates, costRate, load.wall.Seconds(), load.cores(), 1000*load.cpu/costCreates, load.rssMiB())
		b.Logf("plain client-go, %d pod creates at %d/s until all run (%.1f s): %.3f cores (%.2f CPU-ms per create), peak RSS %.1f MiB",
			costCreates, costRate, raw.Wall, rawCores, 1000*raw.CPUSeconds/costCreates, rawMiB)
		b.Logf("broker / plain client: CPU %.1f×, RSS %.1f×", load.cpu/raw.CPUSeconds, load.rssMiB()/rawMiB)
	}
}

// usage is a process's CPU time and largest RSS over a window.
type usage struct {
	wall   time.Duration
	cpu    float64 // seconds
	maxRSS int64   // KiB
}

func (u usage) cores() float64  { return u.cpu / u.wall.Seconds() }
func (u usage) rssMiB() float64 { return float64(u.maxRSS) / 1024 }

// measure runs work and returns the CPU time process pid used meanwhile
// and its largest resident set, sampled every 100 ms.
func measure(ctx context.Context, pid int, work func(ctx context.Context) error) (usage, error) {
	cpu0, err := procCPU(pid)
	if err != nil {
		return usage{}, err
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- work(ctx) }()
	var u usage
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if rss, err := procRSS(pid); err == nil {
			u.maxRSS = max(u.maxRSS, rss)
		}
		select {
		case err := <-done:
			if err != nil {
				return usage{}, err
			}
			cpu1, err := procCPU(pid)
			if err != nil {
				return usage{}, err
			}
			u.wall, u.cpu = time.Since(start), cpu1-cpu0
			return u, nil
		case <-tick.C:
		}
	}
}

// procCPU is utime+stime of pid in seconds (/proc/<pid>/stat).
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it follow ')'.
	rest := string(b[bytes.LastIndexByte(b, ')')+2:])
	f := strings.Fields(rest) // f[0] is field 3 (state); utime is field 14
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return (ut + st) / clockTicks, nil
}

// procRSS is VmRSS of pid in KiB (/proc/<pid>/status).
func procRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// brokerCreates creates costCreates servers through the broker, costRate a
// second spread over the clients' users, and waits until every one runs.
func brokerCreates(ctx context.Context, e *env, clients []*harness.Client, round int) error {
	tick := time.NewTicker(time.Second / costRate)
	defer tick.Stop()
	var wg sync.WaitGroup
	errs := make(chan error, costCreates)
	for i := range costCreates {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		cl := clients[i%len(clients)]
		user := fmt.Sprintf("bench%d", i%len(clients))
		wg.Go(func() {
			if _, _, err := cl.CreateServer(ctx, user, fmt.Sprintf("c%d-%d", round, i), "", v1.CreateServerRequest{Profile: "tiny"}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("create through the broker: %w", err)
	}
	return harness.Poll(ctx, 200*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, string, error) {
		all, err := e.admin.AllServers(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		running := 0
		for _, s := range all {
			if strings.HasPrefix(s.Name, fmt.Sprintf("c%d-", round)) && s.State == v1.StateRunning {
				running++
			}
		}
		return running == costCreates, fmt.Sprintf("%d of %d running", running, costCreates), nil
	})
}

// rawCreates runs the test binary as the plain client-go creator on the
// env's namespace and nodes, with the broker's Kubernetes client rate
// limit, and returns what it reports.
func rawCreates(ctx context.Context, e *env, round int) (rawCreatorResult, error) {
	job, err := json.Marshal(rawCreatorJob{Kubeconfig: e.cluster.AdminKubeconfig, Namespace: e.ns, Nodes: e.nodes,
		Count: costCreates, Rate: costRate})
	if err != nil {
		return rawCreatorResult{}, err
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$") // #nosec G204 -- the test binary itself
	cmd.Env = append(os.Environ(), rawCreatorEnv+"="+string(job), fmt.Sprintf("E2E_RAW_POD_ROUND=%d", round))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return rawCreatorResult{}, fmt.Errorf("plain creator: %w\n%s", err, stderr.String())
	}
	var r rawCreatorResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("plain creator's report %q: %w", out.String(), err)
	}
	return r, nil
}

// runRawCreator is the plain client-go creator (TestMain runs it when
// rawCreatorEnv is set): it creates the job's pods at its rate, pinned to
// its nodes in turn, waits through an informer until all run, and prints
// its own CPU time and peak RSS as a rawCreatorResult.
func runRawCreator(spec string) error {
	var job rawCreatorJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		return err
	}
	start := time.Now()
	rc, err := clientcmd.BuildConfigFromFlags("", job.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 50, 100 // the broker's --kube-api-qps and --kube-api-burst
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	label := "raw-" + os.Getenv("E2E_RAW_POD_ROUND")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	running := map[string]bool{}
	all := make(chan struct{})
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Status.Phase != corev1.PodRunning {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !running[p.Name] {
			running[p.Name] = true
			if len(running) == job.Count {
				close(all)
			}
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(job.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "bench=" + label }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }() // the informer stops with ctx
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("pod informer did not sync")
	}
	tick := time.NewTicker(time.Second / time.Duration(job.Rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	errs := make(chan error, job.Count)
	for i := range job.Count {
		<-tick.C
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", label, i), Labels: map[string]string{"bench": label}},
			Spec: corev1.PodSpec{
				NodeName:   job.Nodes[i%len(job.Nodes)],
				Containers: []corev1.Container{{Name: "notebook", Image: "example.invalid/notebook:1"}},
			},
		}
		wg.Go(func() {
			if _, err := cs.CoreV1().Pods(job.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	select {
	case <-all:
	case <-ctx.Done():
		return fmt.Errorf("pods not all running: %w", ctx.Err())
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return err
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return json.NewEncoder(os.Stdout).Encode(rawCreatorResult{CPUSeconds: cpu.Seconds(), MaxRSSKiB: ru.Maxrss, Wall: time.Since(start).Seconds()})
}
