package devcluster

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/spawner"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs c until the test ends.
func start(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func testPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DefaultNamespace},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "notebook", Image: "jupyter/minimal", Ports: []corev1.ContainerPort{{Name: "notebook", ContainerPort: 8888}},
		}}},
	}
}

// waitPod watches a pod until cond holds, failing after 10 s.
func waitPod(t *testing.T, c *Cluster, name string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	w, err := c.Clientset().CoreV1().Pods(DefaultNamespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if pod, err := c.Clientset().CoreV1().Pods(DefaultNamespace).Get(ctx, name, metav1.GetOptions{}); err == nil && cond(pod) {
		return pod
	}
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before pod %s met the condition", name)
			}
			if pod, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted && pod.Name == name && cond(pod) {
				return pod
			}
		case <-ctx.Done():
			t.Fatalf("pod %s did not meet the condition within 10s", name)
		}
	}
}

func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func TestPodsReachRunning(t *testing.T) {
	c := New([]string{"gpu-1", "gpu-2"}, discard(), WithStepDelay(5*time.Millisecond))
	start(t, c)
	cs := c.Clientset()
	for _, p := range []*corev1.Pod{testPod("a", "gpu-1"), testPod("b", "gpu-2")} {
		if _, err := cs.CoreV1().Pods(DefaultNamespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a := waitPod(t, c, "a", ready)
	b := waitPod(t, c, "b", ready)
	got := []string{string(a.Status.Phase), string(b.Status.Phase)}
	if diff := cmp.Diff([]string{"Running", "Running"}, got); diff != "" {
		t.Errorf("phases (-want +got):\n%s", diff)
	}
	if a.Status.PodIP == "" || a.Status.PodIP == b.Status.PodIP {
		t.Errorf("pod IPs %q and %q must be set and distinct", a.Status.PodIP, b.Status.PodIP)
	}
	if a.UID == "" || a.CreationTimestamp.IsZero() {
		t.Errorf("created pod lacks UID or creation time: %q %v", a.UID, a.CreationTimestamp)
	}
	phase, msg := spawner.Classify(a, time.Now(), spawner.Config{})
	if phase != spawner.PhaseRunning {
		t.Errorf("Classify = %s %q, want running", phase, msg)
	}
}

func TestUnknownNodeIsUnschedulable(t *testing.T) {
	c := New([]string{"gpu-1"}, discard(), WithStepDelay(5*time.Millisecond))
	start(t, c)
	if _, err := c.Clientset().CoreV1().Pods(DefaultNamespace).Create(t.Context(), testPod("lost", "gpu-9"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, c, "lost", func(p *corev1.Pod) bool { return len(p.Status.Conditions) > 0 })
	cond := pod.Status.Conditions[0]
	got := []string{string(cond.Type), string(cond.Status), cond.Reason, cond.Message}
	want := []string{"PodScheduled", "False", "Unschedulable", `node "gpu-9" is not part of the simulated cluster (nodes: gpu-1)`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("condition (-want +got):\n%s", diff)
	}
}

func TestPrefilledObjects(t *testing.T) {
	c := New([]string{"gpu-1"}, discard(), WithNamespace("dev"))
	cs := c.Clientset()
	ctx := t.Context()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "dev", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace: %v", err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("dev").Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("service account: %v", err)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	if n.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("node not Ready: %+v", n.Status.Conditions)
	}
}

// TestWithSpawnerClient runs the spawner against the simulated cluster, as
// gpubroker-dev does, and checks that a created server reaches running
// with its URL and is gone after Delete.
func TestWithSpawnerClient(t *testing.T) {
	c := New([]string{"gpu-1"}, discard(), WithStepDelay(5*time.Millisecond))
	start(t, c)
	client := spawner.New(c.Clientset(), spawner.Config{Namespace: DefaultNamespace}, discard(), spawner.WithResync(20*time.Millisecond))
	events := make(chan spawner.PodEvent, 100)
	ctx, cancel := context.WithCancel(t.Context())
	client.Subscribe(ctx, func(ev spawner.PodEvent) { events <- ev })
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("spawner Run: %v", err)
		}
	})
	if err := client.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	spec := spawner.Spec{
		User: "dev@example.org", SpawnID: "s1", Profile: "small", Image: "jupyter/minimal", CPU: "1", Memory: "2Gi",
		Slice: v1.Slice{MemoryMiB: 4096, ComputePercent: 10, ComputeLimitPercent: 100},
		GPU:   v1.GPURef{UUID: "GPU-1", Node: "gpu-1"},
	}
	if err := client.Create(t.Context(), spec, map[string]string{"JUPYTERHUB_API_TOKEN": "t"}); err != nil {
		t.Fatal(err)
	}
	var phases []spawner.Phase
	wait := func(p spawner.Phase) spawner.PodEvent {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case ev := <-events:
				phases = append(phases, ev.Phase)
				if ev.Phase == p {
					return ev
				}
			case <-deadline:
				t.Fatalf("no %s event within 10s; saw %v", p, phases)
			}
		}
	}
	ev := wait(spawner.PhaseRunning)
	if ev.URL == "" || ev.User != spec.User || ev.SpawnID != "s1" {
		t.Errorf("running event %+v lacks URL or identity", ev)
	}
	if err := client.Delete(t.Context(), spec.User, spec.Server, spec.SpawnID); err != nil {
		t.Fatal(err)
	}
	wait(spawner.PhaseGone)
	if phases[0] != spawner.PhasePending && phases[0] != spawner.PhaseStarting {
		t.Errorf("first phase %s, want pending or starting (all: %v)", phases[0], phases)
	}
}
