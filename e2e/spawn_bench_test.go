package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// The spawn benchmark's shape: 12 clients at a time on 4 nodes
// × 8 GPUs, each spawning spawnsPerClient servers one after the other.
const (
	spawnClients    = 12
	spawnsPerClient = 10
	spawnNodes      = 4
	spawnGPUs       = 8
)

// spawnProfiles lets every bench user hold all of its servers: the spawn
// benchmark and the scale rig measure the spawn path, not quotas. 1 %
// compute and 512 MiB fit 100 per GPU.
const spawnProfiles = `
profiles:
  - name: tiny
    displayName: Tiny
    image: example.invalid/notebook:1
    cpu: "100m"
    memory: 256Mi
    slice: {memoryMiB: 512, computePercent: 1, computeLimitPercent: 10}
quotas:
  defaultUser: {servers: 1000}
`

// BenchmarkSpawnThroughput puts the broker's spawn path next to the API
// server it drives, in one run on one cluster: spawnClients clients at a
// time each create spawnsPerClient pods directly with client-go (the API
// server's own speed, kwok moving them to Running), then the same number of
// servers through the broker (PUT, then the server's event stream until
// running). It reports spawns per second and create→running p50/p99 of
// both, their ratio and the latency the broker adds.
//
//	go test -run='^$' -bench=SpawnThroughput -benchtime=1x ./e2e/
//
// Extra gpubroker serve flags for a comparison come after -args:
// -spawn-broker-args='--kube-api-qps=5 --kube-api-burst=10'.
func BenchmarkSpawnThroughput(b *testing.B) {
	e := newEnv(b, envOptions{nodes: spawnNodes, gpusPerNode: spawnGPUs, profiles: spawnProfiles, brokerArgs: spawnBrokerArgs()})
	ctx := b.Context()
	clients := make([]*harness.Client, spawnClients)
	for i := range clients {
		clients[i] = e.client(fmt.Sprintf("bench%d", i), "ml")
	}
	b.ResetTimer()
	for round := range b.N {
		plain, err := plainPodSpawns(ctx, e, round)
		if err != nil {
			b.Fatalf("plain pods: %v", err)
		}
		broker, err := brokerSpawns(ctx, clients, round)
		if err != nil {
			b.Fatalf("broker: %v", err)
		}
		b.ReportMetric(plain.perSecond(), "pod-creates/s")
		b.ReportMetric(broker.perSecond(), "spawns/s")
		b.ReportMetric(broker.perSecond()/plain.perSecond(), "spawn/pod-ratio")
		b.ReportMetric(ms(broker.quantile(0.50)), "spawn-p50-ms")
		b.ReportMetric(ms(broker.quantile(0.99)), "spawn-p99-ms")
		b.ReportMetric(ms(plain.quantile(0.50)), "pod-p50-ms")
		b.ReportMetric(ms(plain.quantile(0.99)), "pod-p99-ms")
		b.Logf("%d clients × %d, %d nodes × %d GPUs; broker flags %q", spawnClients, spawnsPerClient, spawnNodes, spawnGPUs, spawnBrokerArgs())
		b.Logf("plain pod creates: %6.1f/s  create→running p50 %6.0f ms  p99 %6.0f ms", plain.perSecond(), ms(plain.quantile(0.5)), ms(plain.quantile(0.99)))
		b.Logf("broker spawns:     %6.1f/s  create→running p50 %6.0f ms  p99 %6.0f ms", broker.perSecond(), ms(broker.quantile(0.5)), ms(broker.quantile(0.99)))
		b.Logf("ratio %.2f; added by the broker: p50 %+.0f ms, p99 %+.0f ms", broker.perSecond()/plain.perSecond(),
			ms(broker.quantile(0.5)-plain.quantile(0.5)), ms(broker.quantile(0.99)-plain.quantile(0.99)))
	}
}

// spawnBrokerArgsFlag holds extra gpubroker serve flags for the benchmark.
var spawnBrokerArgsFlag = flag.String("spawn-broker-args", "", "extra gpubroker serve flags for BenchmarkSpawnThroughput, space-separated")

func spawnBrokerArgs() []string { return strings.Fields(*spawnBrokerArgsFlag) }

// spawnRun is one side's measurement: wall time and each spawn's
// create→running latency.
type spawnRun struct {
	wall      time.Duration
	latencies []time.Duration
}

func (r spawnRun) perSecond() float64 { return float64(len(r.latencies)) / r.wall.Seconds() }

// quantile is the q-quantile by the nearest-rank method.
func (r spawnRun) quantile(q float64) time.Duration {
	s := slices.Clone(r.latencies)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// runClients runs spawnClients workers that each call one spawnsPerClient
// times in sequence, and returns the wall time and every latency.
func runClients(ctx context.Context, one func(ctx context.Context, client, i int) (time.Duration, error)) (spawnRun, error) {
	var (
		mu   sync.Mutex
		run  spawnRun
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for c := range spawnClients {
		wg.Go(func() {
			for i := range spawnsPerClient {
				d, err := one(ctx, c, i)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					run.latencies = append(run.latencies, d)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	run.wall = time.Since(start)
	return run, errors.Join(errs...)
}

// plainPodSpawns creates pods pinned to the env's kwok nodes with the
// admin client and waits, through an informer, for each to run.
func plainPodSpawns(ctx context.Context, e *env, round int) (spawnRun, error) {
	label := fmt.Sprintf("bench-plain-%d", round)
	var mu sync.Mutex
	running := map[string]chan struct{}{}
	waitFor := func(name string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		ch, ok := running[name]
		if !ok {
			ch = make(chan struct{})
			running[name] = ch
		}
		return ch
	}
	seen := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Status.Phase == corev1.PodRunning {
			ch := waitFor(p.Name)
			mu.Lock()
			select {
			case <-ch:
			default:
				close(ch)
			}
			mu.Unlock()
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(e.cluster.Client, 0, informers.WithNamespace(e.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "bench=" + label }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		return spawnRun{}, err
	}
	ictx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); factory.Shutdown() }()
	factory.Start(ictx.Done())
	if !cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
		return spawnRun{}, errors.New("pod informer did not sync")
	}
	return runClients(ctx, func(ctx context.Context, c, i int) (time.Duration, error) {
		name := fmt.Sprintf("%s-%d-%d", label, c, i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": label}},
			Spec: corev1.PodSpec{
				NodeName:   e.nodes[(c*spawnsPerClient+i)%len(e.nodes)],
				Containers: []corev1.Container{{Name: "notebook", Image: "example.invalid/notebook:1"}},
			},
		}
		ch := waitFor(name)
		start := time.Now()
		if _, err := e.cluster.Client.CoreV1().Pods(e.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return 0, fmt.Errorf("create pod %s: %w", name, err)
		}
		select {
		case <-ch:
			return time.Since(start), nil
		case <-time.After(time.Minute):
			return 0, fmt.Errorf("pod %s not running within a minute", name)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
}

// brokerSpawns creates servers through the broker and follows each one's
// event stream until it is running.
func brokerSpawns(ctx context.Context, clients []*harness.Client, round int) (spawnRun, error) {
	return runClients(ctx, func(ctx context.Context, c, i int) (time.Duration, error) {
		user, name := fmt.Sprintf("bench%d", c), fmt.Sprintf("r%d-nb%d", round, i)
		return createRunning(ctx, clients[c], user, name)
	})
}
