package agent

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func notebookPod(name, node, uid, spawn string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid),
			Labels: map[string]string{v1.LabelManagedBy: v1.ManagedByValue},
			Annotations: map[string]string{v1.AnnotationSpawnID: spawn, v1.AnnotationGPUUUID: "GPU-1",
				v1.AnnotationUser: "Alice@example.com", v1.AnnotationServer: "lab",
				v1.AnnotationMemoryMiB: "8192", v1.AnnotationComputePercent: "20", v1.AnnotationComputeLimitPercent: "40"}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func TestSliceFromPod(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(p *corev1.Pod)
		want    SliceInfo
		wantErr []string
	}{
		{name: "complete pod", edit: func(*corev1.Pod) {},
			want: SliceInfo{ID: "spawn-1", PodUID: uidA, Pod: "nb", Namespace: "ns", User: "Alice@example.com", Server: "lab", GPU: "GPU-1",
				Initial: v1.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 40}, Sharing: v1.SharingSliced}},
		{name: "every problem at once", edit: func(p *corev1.Pod) {
			p.Annotations[v1.AnnotationMemoryMiB] = "lots"
			p.Annotations[v1.AnnotationGPUUUID] = ""
			p.Annotations[v1.AnnotationSpawnID] = "../../etc"
		}, wantErr: []string{"memory-mib", "gpu-uuid", "slice id"}},
		{name: "slice id that is not a directory name", edit: func(p *corev1.Pod) { p.Annotations[v1.AnnotationSpawnID] = ".hidden" },
			wantErr: []string{"slice id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := notebookPod("nb", "gpu-1", uidA, "spawn-1")
			tc.edit(p)
			got, err := SliceFromPod(p)
			if len(tc.wantErr) > 0 {
				if !errors.Is(err, ErrBadPod) {
					t.Fatalf("err = %v, want ErrBadPod", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("slice (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPodWatcherFollowsThisNodesPods runs the informer over a fake
// clientset: pods of other nodes and unmanaged pods are ignored, deleted
// and finished pods leave the index. (The fake clientset does not apply
// field selectors, so the other node's pod reaches the watcher's own node
// check.)
func TestPodWatcherFollowsThisNodesPods(t *testing.T) {
	unmanaged := notebookPod("other", "gpu-1", uidC, "spawn-3")
	unmanaged.Labels = nil
	client := fake.NewClientset(notebookPod("a", "gpu-1", uidA, "spawn-1"), unmanaged,
		notebookPod("elsewhere", "gpu-2", uidX, "spawn-9"))
	var bad []error
	w := NewPodWatcher(client, "gpu-1", func(err error) { bad = append(bad, err) })
	ctx := runWatcher(t, w)
	ids := func() []string {
		var out []string
		for _, s := range w.Slices() {
			out = append(out, s.ID)
		}
		return out
	}
	waitUntil(t, "synced with spawn-1", func() bool { return w.Synced() && cmp.Equal(ids(), []string{"spawn-1"}) })
	if _, ok := w.ByPodUID(uidA); !ok {
		t.Error("ByPodUID(a) not found")
	}

	select { // the notice of spawn-1, if still pending
	case <-w.Changed():
	default:
	}
	b := notebookPod("b", "gpu-1", uidB, "spawn-2")
	if _, err := client.CoreV1().Pods("ns").Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select { // the agent prepares a new slice on this notice
	case <-w.Changed():
	case <-time.After(20 * time.Second):
		t.Fatal("no change notice for the new pod within 20 s")
	}
	waitUntil(t, "spawn-2 added", func() bool { return cmp.Equal(ids(), []string{"spawn-1", "spawn-2"}) })

	b.Status.Phase = corev1.PodSucceeded
	if _, err := client.CoreV1().Pods("ns").UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "finished spawn-2 removed", func() bool { return cmp.Equal(ids(), []string{"spawn-1"}) })

	if err := client.CoreV1().Pods("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "deleted spawn-1 removed", func() bool { return len(ids()) == 0 })
}

func TestPodWatcherWithNamespaceSeesOnlyThatNamespace(t *testing.T) {
	other := notebookPod("other-ns", "gpu-1", uidB, "spawn-2")
	other.Namespace = "elsewhere"
	client := fake.NewClientset(notebookPod("a", "gpu-1", uidA, "spawn-1"), other)
	w := NewPodWatcher(client, "gpu-1", nil, WithNamespace("ns"))
	runWatcher(t, w)
	waitUntil(t, "synced", w.Synced)
	var ids []string
	for _, s := range w.Slices() {
		ids = append(ids, s.ID)
	}
	if diff := cmp.Diff([]string{"spawn-1"}, ids); diff != "" {
		t.Errorf("slices in namespace ns (-want +got):\n%s", diff)
	}
}

// runWatcher runs w until t ends, and fails t if Run fails; the context
// returned ends then too.
func runWatcher(t *testing.T, w *PodWatcher) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctx
}

// waitUntil polls cond every 5 ms for up to 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		tm := time.NewTimer(5 * time.Millisecond)
		<-tm.C
	}
}

func TestPidfdKillerKillsOnlyTheSameProcess(t *testing.T) {
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatalf("sleep: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	k := PidfdKiller{}
	proc := ProcFS{Root: "/proc"}

	other := start()
	pid := uint32(other.Process.Pid)
	st, err := proc.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Kill(pid, st+1); !errors.Is(err, ErrNoProcess) {
		t.Errorf("kill with a wrong start time: %v, want ErrNoProcess", err)
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("process with another start time was signalled: %v", err)
	}

	if err := k.Kill(pid, st); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := other.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("sleep ended with %v, want killed", err)
	}
	if err := k.Kill(pid, st); !errors.Is(err, ErrNoProcess) {
		t.Errorf("kill of a reaped process: %v, want ErrNoProcess", err)
	}
}
