package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner"
)

// createRunning creates user's server name and follows its event stream
// until it runs (2 minutes at most); the latency is from the PUT to the
// running event. The spawn benchmark and the scale rig both use it.
func createRunning(ctx context.Context, c *harness.Client, user, name string) (time.Duration, error) {
	return createRunningSteps(ctx, c, user, name, nil, nil)
}

// spawnSteps collects where the time of creates through the broker went,
// step by step, from the times of their events (the broker's clock, which
// is this machine's): the answer and the events' times against the PUT.
type spawnSteps struct {
	mu    sync.Mutex
	steps map[string][]time.Duration
	each  []createSteps // by create, in completion order
}

// createSteps is one create's total and its steps by name.
type createSteps struct {
	total time.Duration
	steps map[string]time.Duration
}

// spawnStepNames are the steps spawnSteps reports, in their order.
var spawnStepNames = []string{
	"PUT→pending (request to record)", "pending→creating (placement)", "creating→starting (Secret and pod created)",
	"starting→running (the pod runs, its event reaches the record)", "running→client (event stream)", "PUT answered",
	"  of starting→running: to the pod running (the rig's own watch)", "  of starting→running: pod running→record running",
}

// record adds one create that took total, with its steps.
func (s *spawnSteps) record(total time.Duration, steps map[string]time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.steps == nil {
		s.steps = map[string][]time.Duration{}
	}
	for name, d := range steps {
		s.steps[name] = append(s.steps[name], d)
	}
	s.each = append(s.each, createSteps{total: total, steps: steps})
}

// slowest is the mean of each step over the slowest frac (0..1, at least
// one) of the creates, and how many those are: where the tail's time went,
// which the steps' own quantiles (each from other creates) cannot say.
func (s *spawnSteps) slowest(frac float64) (int, map[string]time.Duration) {
	s.mu.Lock()
	each := slices.Clone(s.each)
	s.mu.Unlock()
	slices.SortFunc(each, func(a, b createSteps) int { return int(b.total - a.total) })
	n := min(max(int(frac*float64(len(each))), 1), len(each))
	sums, counts := map[string]time.Duration{}, map[string]int{}
	for _, c := range each[:n] {
		sums["total"] += c.total
		counts["total"]++
		for name, d := range c.steps {
			sums[name] += d
			counts[name]++
		}
	}
	for name := range sums {
		sums[name] /= time.Duration(counts[name])
	}
	return n, sums
}

// createRunningSteps is createRunning, adding each create's steps to
// steps when it is not nil; podRunning, when not nil, is closed when the
// rig's own watch sees the server's pod running, which splits the step
// from starting to running into the pod's start and the broker's handling
// of it.
func createRunningSteps(ctx context.Context, c *harness.Client, user, name string, steps *spawnSteps, podRunning <-chan struct{}) (time.Duration, error) {
	start := time.Now()
	seen := make(chan time.Time, 1)
	if podRunning != nil {
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			select {
			case <-podRunning:
				seen <- time.Now()
			case <-wctx.Done():
			}
		}()
	}
	if _, status, err := c.CreateServer(ctx, user, name, "", v1.CreateServerRequest{Profile: "tiny"}); err != nil {
		return 0, fmt.Errorf("create %s/%s: %d %w", user, name, status, err)
	}
	answered := time.Since(start)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stream, err := c.Events(sctx, user, name, "")
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	at := map[v1.ServerState]time.Time{}
	for {
		ev, err := stream.Next()
		if err != nil {
			return 0, fmt.Errorf("events of %s/%s: %w", user, name, err)
		}
		if _, seen := at[ev.State]; !seen {
			at[ev.State] = ev.Time
		}
		switch ev.State {
		case v1.StateRunning:
			took := time.Since(start)
			if steps != nil {
				m := map[string]time.Duration{
					spawnStepNames[0]: at[v1.StatePending].Sub(start),
					spawnStepNames[1]: at[v1.StateCreating].Sub(at[v1.StatePending]),
					spawnStepNames[2]: at[v1.StateStarting].Sub(at[v1.StateCreating]),
					spawnStepNames[3]: at[v1.StateRunning].Sub(at[v1.StateStarting]),
					spawnStepNames[4]: took - at[v1.StateRunning].Sub(start),
					spawnStepNames[5]: answered,
				}
				select {
				case t := <-seen:
					m[spawnStepNames[6]] = t.Sub(at[v1.StateStarting])
					m[spawnStepNames[7]] = at[v1.StateRunning].Sub(t)
				default: // the rig's watch has not seen it yet
				}
				steps.record(took, m)
			}
			return took, nil
		case v1.StateFailed:
			return 0, fmt.Errorf("%s/%s failed: %s", user, name, ev.Message)
		}
	}
}

// rawPods creates plain pods labelled bench=<label> with the admin's
// client-go client (QPS 200, burst 400), pinned to the env's nodes in turn,
// and tells when each runs: the baseline the broker's creates are compared
// with. Each is a copy of template, a notebook pod as a broker made it, so
// the API server and kwok handle the same pod on both sides and the
// difference is what the broker adds; the copy carries no gpubroker labels
// (no replica sees it) and no finalizer.
type rawPods struct {
	e        *env
	cs       kubernetes.Interface
	label    string
	template *corev1.Pod
	w        *harness.PodWatch
}

// newRawPods starts the watch of the pods labelled bench=label, both
// through cs (rigClient).
func newRawPods(ctx context.Context, e *env, cs kubernetes.Interface, label string, template *corev1.Pod) (*rawPods, error) {
	w, err := harness.WatchPods(ctx, cs, e.ns, "bench="+label)
	if err != nil {
		return nil, err
	}
	return &rawPods{e: e, cs: cs, label: label, template: template, w: w}, nil
}

// rigClient is the admin's client-go client (QPS 200, burst 400) speaking
// to the API server as the brokers do (cliconfig.Kube.RESTConfig):
// protobuf, no gzip. The raw pods and the rig's watches use it, so a raw
// create and a broker's cost the API server the same encoding.
func rigClient(e *env) (kubernetes.Interface, error) {
	rc := rest.CopyConfig(e.cluster.RESTConfig)
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	rc.DisableCompression = true
	return kubernetes.NewForConfig(rc)
}

// serverPodTemplate creates server name of user through c, copies its pod
// as the API server holds it (spec and annotations, nothing a server
// wrote), then stops the server, waits until it is stopped and its pod
// gone, and removes it: nothing of it is left to cost CPU in a phase.
func serverPodTemplate(ctx context.Context, e *env, c *harness.Client, user, name string) (*corev1.Pod, error) {
	if _, err := createRunning(ctx, c, user, name); err != nil {
		return nil, fmt.Errorf("template server: %w", err)
	}
	podName := spawner.PodName(user, name)
	pod, err := e.cluster.Client.CoreV1().Pods(e.ns).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("template server's pod: %w", err)
	}
	template := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Annotations: maps.Clone(pod.Annotations)},
		Spec:       *pod.Spec.DeepCopy(),
	}
	if _, err := c.DeleteServer(ctx, user, name); err != nil {
		return nil, fmt.Errorf("stop the template server: %w", err)
	}
	if _, err := c.WaitServer(ctx, user, name, v1.StateStopped, time.Minute); err != nil {
		return nil, fmt.Errorf("the template server: %w", err)
	}
	err = harness.Poll(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		_, err := e.cluster.Client.CoreV1().Pods(e.ns).Get(ctx, podName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, fmt.Sprintf("reading the template server's pod: %v", err), nil // a transient error: try again
		}
		return false, "the template server's pod is still there", nil
	})
	if err != nil {
		return nil, err
	}
	if _, err := c.Do(ctx, http.MethodDelete, harness.ServerPath(user, name)+"?remove=true", nil, nil, nil); err != nil {
		return nil, fmt.Errorf("remove the template server: %w", err)
	}
	return template, nil
}

// create creates raw pod i and waits until it runs (at most 2 minutes):
// the latency from the create sent to the pod seen Running.
func (p *rawPods) create(ctx context.Context, i int) (time.Duration, error) {
	name := fmt.Sprintf("%s-%d", p.label, i)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": p.label}, Annotations: maps.Clone(p.template.Annotations)},
		Spec:       *p.template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = p.e.nodes[i%len(p.e.nodes)]
	running := p.w.Running(name)
	start := time.Now()
	if _, err := p.cs.CoreV1().Pods(p.e.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create pod %s: %w", name, err)
	}
	select {
	case <-running:
		return time.Since(start), nil
	case <-time.After(2 * time.Minute):
		return 0, fmt.Errorf("pod %s not running within 2 minutes", name)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// removeAll deletes every pod of the label, waits until the watch holds
// none, and stops the watch.
func (p *rawPods) removeAll(ctx context.Context) error {
	defer p.w.Stop()
	zero := int64(0)
	if err := p.cs.CoreV1().Pods(p.e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: "bench=" + p.label}); err != nil {
		return fmt.Errorf("delete the raw pods: %w", err)
	}
	return harness.Poll(ctx, 200*time.Millisecond, 5*time.Minute, func(context.Context) (bool, string, error) {
		n := p.w.Count()
		return n == 0, fmt.Sprintf("%d raw pods labelled %s left", n, p.label), nil
	})
}

// interleaved runs two kinds of operation as one load, alternating by
// index (operation 2k is a(k), 2k+1 is b(k)), so both start in the same
// window at the same offered rate (each half of l's) and meet the same
// API server, kwok and CPU load. l.Count is the number of each kind. Each
// result has the load's wall time and its own kind's latencies.
func interleaved(ctx context.Context, l harness.Load, a, b func(ctx context.Context, i int) (time.Duration, error)) (ra, rb harness.LoadResult, err error) {
	var mu sync.Mutex
	n := l.Count
	l.Count = 2 * n
	res, err := l.Run(ctx, func(ctx context.Context, i int) (time.Duration, error) {
		op, into := a, &ra.Latencies
		if i%2 == 1 {
			op, into = b, &rb.Latencies
		}
		d, err := op(ctx, i/2)
		if err == nil {
			mu.Lock()
			*into = append(*into, d)
			mu.Unlock()
		}
		return d, err
	})
	ra.Wall, rb.Wall = res.Wall, res.Wall
	return ra, rb, err
}
