package podhook_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/hook/podhook"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
	"github.com/gpubroker/gpubroker/limiter/region"
	"github.com/gpubroker/gpubroker/spawner"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

const (
	namespace = "gpubroker"
	node      = "runner-0"
	image     = "example.invalid/cuda:1"
	sliceMiB  = 1024
)

// TestPodRunsInItsSliceUnderTheHook runs two broker pods through the pod
// runner with podhook as its Limiter, each running cudaprog on the stub
// driver: the pod that mounts the limiter sees its slice (cuMemGetInfo's
// total is the slice's MiB, written as the agent writes it from the pod's
// annotations, and an allocation past it is refused), the pod that does
// not mount it gets no hook and sees the whole simulated GPU.
func TestPodRunsInItsSliceUnderTheHook(t *testing.T) {
	stubtest.Need(t)
	dir := t.TempDir()
	host := filepath.Join(dir, "host")
	l, err := podhook.New(filepath.Join(dir, "stub.state"))
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	r, err := runner.New(runner.Config{
		Client: cs, Namespace: namespace, Nodes: []string{node}, Dir: filepath.Join(dir, "run"), HostRoot: host,
		// The image's own environment finds the stub driver, so that a
		// process without the limiter runs on the simulated GPU too.
		Images: map[string]runner.Image{image: {Env: []string{
			"LD_LIBRARY_PATH=" + stubtest.StubDir(), "GPUBROKER_STUB_STATE=" + filepath.Join(dir, "stub.state")}}},
		StopGrace: 5 * time.Second, ProbeInterval: 20 * time.Millisecond,
		Limiter: &runner.Limiter{Wrap: l.Wrap, Env: l.Env()},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	cfg := spawner.Config{Namespace: namespace}.WithDefaults()
	hook := filepath.Join(host, cfg.HostRoot, v1.HostHookSubdir)
	if err := os.MkdirAll(hook, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hook, "ld.so.preload"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	past := strconv.Itoa((sliceMiB + 1) << 20)
	start := func(server string, limited bool) string {
		t.Helper()
		out := filepath.Join(dir, server+".out")
		spec := spawner.Spec{
			User: "ada", Server: server, SpawnID: "spawn-" + server, Profile: "small", Image: image,
			Slice: v1.Slice{MemoryMiB: sliceMiB, ComputePercent: 10, ComputeLimitPercent: 50},
			GPU:   v1.GPURef{UUID: stubtest.DeviceUUID, Node: node},
			Env:   map[string]string{"OUT": out},
			// cudaprog's answers land in OUT once complete; the process
			// then stays up like a notebook until the runner stops it.
			Command: []string{"/bin/sh", "-c", `"$0" meminfo , alloc linear "$1" >"$OUT.part" 2>&1; mv "$OUT.part" "$OUT"; exec sleep 600`,
				filepath.Join(stubtest.BuildDir(), "cudaprog"), past},
		}
		pod, err := spawner.Pod(cfg, spec)
		if err != nil {
			t.Fatal(err)
		}
		if !limited {
			c := &pod.Spec.Containers[0]
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == v1.PodPreload })
		}
		pod.UID = types.UID("uid-" + server)
		if _, err := cs.CoreV1().Pods(namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	limited, plain := start("limited", true), start("plain", false)

	read := func(name, out string) map[string][]string {
		t.Helper()
		var text string
		stubtest.Eventually(t, name+" pod's cudaprog output", func() (bool, string) {
			b, err := os.ReadFile(out)
			text = string(b)
			if err != nil {
				return false, fmt.Sprintf("%v; pod %s", err, podState(t, cs, name))
			}
			return true, ""
		})
		lines := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 {
				lines[f[0]] = f[1:]
			}
		}
		return lines
	}
	sliceBytes := strconv.Itoa(sliceMiB << 20)
	got := read("limited", limited)
	if m := got["meminfo"]; len(m) != 3 || m[0] != "0" || m[2] != sliceBytes {
		t.Errorf("limited pod: meminfo %q, want CUresult 0 and total %s (the slice's %d MiB)", m, sliceBytes, sliceMiB)
	}
	if a := got["alloc"]; len(a) < 1 || a[0] != "2" {
		t.Errorf("limited pod: alloc of %s bytes: %q, want CUDA_ERROR_OUT_OF_MEMORY (2)", past, a)
	}
	q, err := region.ReadQuota(filepath.Join(host, cfg.HostRoot, v1.HostSlicesSubdir, "spawn-limited", "quota", v1.QuotaFileName))
	if err != nil || q.MemoryLimitBytes != sliceMiB<<20 || q.ComputePercent != 10 || q.ComputeLimitPercent != 50 || q.GPUUUID != stubtest.DeviceUUID {
		t.Errorf("limited pod's quota file: %+v, %v; want the pod's slice", q, err)
	}

	got = read("plain", plain)
	if m := got["meminfo"]; len(m) != 3 || m[0] != "0" || m[2] == sliceBytes {
		t.Errorf("pod without the limiter: meminfo %q, want CUresult 0 and the whole simulated GPU's total", m)
	}
	if a := got["alloc"]; len(a) < 1 || a[0] != "0" {
		t.Errorf("pod without the limiter: alloc of %s bytes: %q, want success (no hook)", past, a)
	}
}

// podState describes the runner's pod for server, for a failure message.
func podState(t *testing.T, cs *fake.Clientset, server string) string {
	p, err := cs.CoreV1().Pods(namespace).Get(t.Context(), spawner.PodName("ada", server), metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s %+v", p.Status.Phase, p.Status.ContainerStatuses)
}
