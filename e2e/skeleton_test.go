package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner"
)

// TestServerLifecycle walks the skeleton: a user with a real token creates a
// server; its pod on the real API server carries the pod contract and is
// pinned to the placed node and GPU; the server reports running with its URL;
// another user gets 404; delete removes the pod and frees the slice.
func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{nodes: 2, gpusPerNode: 1})
	ctx := t.Context()
	alice := e.client("alice", "ml")
	const secretValue = "api-token-value-3f9c1d"
	req := v1.CreateServerRequest{
		Profile:   "small",
		Env:       map[string]string{"E2E_PLAIN": "plain-value"},
		SecretEnv: map[string]string{"E2E_API_TOKEN": secretValue},
	}

	created, status, err := alice.CreateServer(ctx, "alice", "nb", "key-1", req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if status != http.StatusCreated {
		t.Errorf("create: status %d, want 201", status)
	}
	if created.SpawnID == "" {
		t.Fatalf("create: empty spawn id in %+v", created)
	}
	replay, status, err := alice.CreateServer(ctx, "alice", "nb", "key-1", req)
	if err != nil {
		t.Fatalf("replayed create: %v", err)
	}
	if status != http.StatusOK || replay.SpawnID != created.SpawnID {
		t.Errorf("replayed create: status %d spawn %q, want 200 and %q", status, replay.SpawnID, created.SpawnID)
	}

	running, err := alice.WaitServer(ctx, "alice", "nb", v1.StateRunning, 60*time.Second)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if running.GPU == nil || running.Pod == "" {
		t.Fatalf("running server without GPU or pod: %+v", running)
	}
	gpu, ok := e.gpuByUUID(running.GPU.UUID)
	if !ok {
		t.Fatalf("server placed on unknown GPU %q", running.GPU.UUID)
	}
	if diff := cmp.Diff(v1.GPURef{UUID: gpu.UUID, Node: gpu.Node, Model: gpu.Model}, *running.GPU); diff != "" {
		t.Errorf("server's GPU (-registered +reported):\n%s", diff)
	}

	pod, err := e.cluster.Client.CoreV1().Pods(e.ns).Get(ctx, running.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", running.Pod, err)
	}
	checkPodContract(t, pod, podWant{
		user: "alice", server: "nb", profile: "small", spawnID: created.SpawnID,
		gpu: gpu, slice: v1.Slice{MemoryMiB: 8192, ComputePercent: 10, ComputeLimitPercent: 50},
	})
	if got := pod.Spec.Containers[0].Env; !hasEnv(got, "E2E_PLAIN", "plain-value") {
		t.Errorf("pod env lacks E2E_PLAIN=plain-value: %v", envNames(got))
	}
	secrets := e.checkSecretEnv(t, pod, "E2E_API_TOKEN", secretValue)
	if b, _ := json.Marshal(pod); strings.Contains(string(b), secretValue) {
		t.Errorf("secret value appears in the pod object")
	}
	if b, _ := json.Marshal(running); strings.Contains(string(b), secretValue) {
		t.Errorf("secret value appears in the API's server answer")
	}
	if want := fmt.Sprintf("http://%s:%d", pod.Status.PodIP, notebookPort); pod.Status.PodIP == "" || running.URL != want {
		t.Errorf("server URL %q, want %q", running.URL, want)
	}

	// The event stream replays the spawn's transitions from the start.
	runningEvent := checkEvents(t, alice, "alice", "nb", "", created.SpawnID,
		[]v1.ServerState{v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning})

	// Another user neither sees nor deletes alice's server.
	bob := e.client("bob", "ml")
	_, err = bob.GetServer(ctx, "alice", "nb")
	wantAPIError(t, "bob gets alice's server", err, http.StatusNotFound, v1.CodeNotFound)
	_, err = bob.DeleteServer(ctx, "alice", "nb")
	wantAPIError(t, "bob deletes alice's server", err, http.StatusNotFound, v1.CodeNotFound)
	if s, err := alice.GetServer(ctx, "alice", "nb"); err != nil || s.State != v1.StateRunning {
		t.Errorf("after bob's delete: alice's server %v, %v; want running", s.State, err)
	}

	if got := e.allocated(t); !cmp.Equal(got[gpu.UUID], gpuUse{memoryMiB: 8192, computePercent: 10, slices: 1}, cmp.AllowUnexported(gpuUse{})) {
		t.Errorf("admin GPU view of %s while running: %+v, want 8192 MiB, 10%%, 1 slice", gpu.UUID, got[gpu.UUID])
	}

	status, err = alice.DeleteServer(ctx, "alice", "nb")
	if err != nil || status != http.StatusAccepted {
		t.Fatalf("delete: status %d, %v; want 202", status, err)
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		_, err := e.cluster.Client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, fmt.Sprintf("pod %s still there (%v)", pod.Name, err), nil
	})
	if err != nil {
		t.Fatalf("pod not deleted: %v", err)
	}
	if _, err := alice.WaitServer(ctx, "alice", "nb", v1.StateStopped, 30*time.Second); err != nil {
		t.Errorf("%v", err)
	}
	e.checkSecretsGone(t, pod, secrets)
	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		got := e.allocated(t)
		want := map[string]gpuUse{}
		return cmp.Equal(want, got, cmp.AllowUnexported(gpuUse{})), fmt.Sprintf("allocated %+v", got), nil
	})
	if err != nil {
		t.Errorf("slice not freed: %v", err)
	}
	// Replay from the running event: only the stop follows, then the stream ends.
	checkEvents(t, alice, "alice", "nb", runningEvent, created.SpawnID, []v1.ServerState{v1.StateStopping, v1.StateStopped})

	// A second delete is accepted too (idempotent stop).
	if status, err := alice.DeleteServer(ctx, "alice", "nb"); err != nil || status != http.StatusAccepted {
		t.Errorf("second delete: status %d, %v; want 202", status, err)
	}
}

// podWant is what a notebook pod must say about its server and slice.
type podWant struct {
	user, server, profile, spawnID string
	gpu                            v1.GPU
	slice                          v1.Slice
}

// checkPodContract checks the labels, annotations, GPU env, mounts and node
// of a notebook pod against ARCHITECTURE.md's pod contract (names in
// broker/api/v1/pod.go). Users and servers in these tests are plain
// lowercase words, so their slugs equal the raw names.
func checkPodContract(t *testing.T, pod *corev1.Pod, w podWant) {
	t.Helper()
	wantLabels := map[string]string{
		v1.LabelManagedBy: v1.ManagedByValue,
		v1.LabelUser:      w.user,
		v1.LabelServer:    w.server,
		v1.LabelSpawnID:   w.spawnID,
	}
	if diff := cmp.Diff(wantLabels, subset(pod.Labels, wantLabels)); diff != "" {
		t.Errorf("pod %s labels (-want +got):\n%s", pod.Name, diff)
	}
	wantAnn := map[string]string{
		v1.AnnotationUser:                w.user,
		v1.AnnotationServer:              w.server,
		v1.AnnotationProfile:             w.profile,
		v1.AnnotationSpawnID:             w.spawnID,
		v1.AnnotationGPUUUID:             w.gpu.UUID,
		v1.AnnotationNode:                w.gpu.Node,
		v1.AnnotationMemoryMiB:           strconv.FormatInt(w.slice.MemoryMiB, 10),
		v1.AnnotationComputePercent:      strconv.Itoa(w.slice.ComputePercent),
		v1.AnnotationComputeLimitPercent: strconv.Itoa(w.slice.ComputeLimitPercent),
	}
	if diff := cmp.Diff(wantAnn, subset(pod.Annotations, wantAnn)); diff != "" {
		t.Errorf("pod %s annotations (-want +got):\n%s", pod.Name, diff)
	}
	if pod.Spec.NodeName != w.gpu.Node {
		t.Errorf("pod %s spec.nodeName %q, want the GPU's node %q", pod.Name, pod.Spec.NodeName, w.gpu.Node)
	}
	if rc := pod.Spec.RuntimeClassName; rc == nil || *rc != harness.RuntimeClassName {
		t.Errorf("pod %s runtimeClassName %v, want %q", pod.Name, rc, harness.RuntimeClassName)
	}
	if len(pod.Spec.Containers) == 0 {
		t.Fatalf("pod %s has no containers", pod.Name)
	}
	c := pod.Spec.Containers[0]
	// The slice reaches the hook only through the read-only quota mount:
	// no GPUBROKER_ variable in the container (the tenant's environment)
	// but the notebook's base URL and the pod's IP (downward API).
	gotEnv := map[string]string{}
	for _, ev := range c.Env {
		if ev.Name == "NVIDIA_VISIBLE_DEVICES" || strings.HasPrefix(ev.Name, "GPUBROKER_") {
			gotEnv[ev.Name] = ev.Value
		}
	}
	wantEnv := map[string]string{"NVIDIA_VISIBLE_DEVICES": w.gpu.UUID, v1.EnvBaseURL: spawner.BaseURL(w.user, w.server), v1.EnvPodIP: ""}
	if diff := cmp.Diff(wantEnv, gotEnv); diff != "" {
		t.Errorf("pod %s GPU env (-want +got):\n%s", pod.Name, diff)
	}
	wantMounts := map[string]bool{ // path → read-only
		v1.PodHookDir:  true,
		v1.PodPreload:  true,
		v1.PodQuotaDir: true,
		v1.PodUsageDir: false,
	}
	gotMounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if _, ok := wantMounts[m.MountPath]; ok {
			gotMounts[m.MountPath] = m.ReadOnly
		}
	}
	if diff := cmp.Diff(wantMounts, gotMounts); diff != "" {
		t.Errorf("pod %s mounts, path → read-only (-want +got):\n%s", pod.Name, diff)
	}
}

// checkSecretEnv checks that the pod takes the variable name from a Secret
// (a secretKeyRef, or envFrom of a whole Secret) and not from a literal, and
// that the Secret holds value under name. It returns the Secrets the pod
// reads its environment from.
func (e *env) checkSecretEnv(t *testing.T, pod *corev1.Pod, name, value string) []string {
	t.Helper()
	var refs []string
	for _, c := range pod.Spec.Containers {
		for _, ev := range c.Env {
			if ev.Name == name && (ev.Value != "" || ev.ValueFrom == nil) {
				t.Errorf("pod %s env %s is a literal, not taken from a Secret", pod.Name, name)
			}
			if ev.ValueFrom != nil && ev.ValueFrom.SecretKeyRef != nil {
				refs = append(refs, ev.ValueFrom.SecretKeyRef.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				refs = append(refs, ef.SecretRef.Name)
			}
		}
	}
	found := false
	for _, ref := range refs {
		sec, err := e.cluster.Client.CoreV1().Secrets(e.ns).Get(t.Context(), ref, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s reads Secret %s: %v", pod.Name, ref, err)
			continue
		}
		if string(sec.Data[name]) == value {
			found = true
		}
	}
	if !found {
		t.Errorf("no Secret the pod %s reads (%v) holds %s with the value sent", pod.Name, refs, name)
	}
	return refs
}

// checkSecretsGone waits until every named Secret is deleted or owned by the
// (deleted) pod, so that no credential outlives its server in a real cluster
// (this cluster runs no garbage collector).
func (e *env) checkSecretsGone(t *testing.T, pod *corev1.Pod, names []string) {
	t.Helper()
	for _, n := range names {
		err := harness.Poll(t.Context(), 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
			sec, err := e.cluster.Client.CoreV1().Secrets(e.ns).Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			if err != nil {
				return false, err.Error(), nil
			}
			for _, o := range sec.OwnerReferences {
				if o.UID == pod.UID {
					return true, "", nil
				}
			}
			return false, "still there, not owned by the pod", nil
		})
		if err != nil {
			t.Errorf("Secret %s outlives its server: %v", n, err)
		}
	}
}

func subset(m, keys map[string]string) map[string]string {
	out := map[string]string{}
	for k := range keys {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}

func hasEnv(env []corev1.EnvVar, name, value string) bool {
	for _, ev := range env {
		if ev.Name == name && ev.Value == value && ev.ValueFrom == nil {
			return true
		}
	}
	return false
}

func envNames(env []corev1.EnvVar) []string {
	out := make([]string, 0, len(env))
	for _, ev := range env {
		out = append(out, ev.Name)
	}
	return out
}

// wantAPIError checks that err is an API answer with the status and code and
// a non-empty message.
func wantAPIError(t *testing.T, what string, err error, status int, code string) {
	t.Helper()
	var ae *harness.APIError
	if !errors.As(err, &ae) {
		t.Errorf("%s: got %v, want HTTP %d %s", what, err, status, code)
		return
	}
	if ae.Status != status || ae.Body.Code != code || strings.TrimSpace(ae.Body.Message) == "" {
		t.Errorf("%s: got HTTP %d code %q message %q, want HTTP %d code %q with a message", what, ae.Status, ae.Body.Code, ae.Body.Message, status, code)
	}
}

func (e *env) gpuByUUID(uuid string) (v1.GPU, bool) {
	for _, g := range e.gpus {
		if g.UUID == uuid {
			return g, true
		}
	}
	return v1.GPU{}, false
}

// gpuUse is what is placed on one GPU.
type gpuUse struct {
	memoryMiB      int64
	computePercent int
	slices         int
}

// allocated returns the admin view's use of every GPU with slices on it.
func (e *env) allocated(t *testing.T) map[string]gpuUse {
	t.Helper()
	list, err := e.admin.GPUs(t.Context())
	if err != nil {
		t.Fatalf("admin GPU view: %v", err)
	}
	out := map[string]gpuUse{}
	for _, g := range list {
		if g.Slices != 0 || g.AllocatedMemoryMiB != 0 || g.AllocatedComputePercent != 0 {
			out[g.UUID] = gpuUse{memoryMiB: g.AllocatedMemoryMiB, computePercent: g.AllocatedComputePercent, slices: g.Slices}
		}
	}
	return out
}

// checkEvents reads the server's event stream after lastEventID until it
// has seen the last of want (and, when that state is terminal, until the
// broker ends the stream), and checks the states, with repeats of one state
// folded, equal want, all for spawnID. It returns the last event's id.
func checkEvents(t *testing.T, cl *harness.Client, user, name, lastEventID, spawnID string, want []v1.ServerState) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := cl.Events(ctx, user, name, lastEventID)
	if err != nil {
		t.Errorf("%v", err)
		return ""
	}
	defer stream.Close()
	var got []v1.ServerState
	var lastID string
	final := want[len(want)-1]
	for {
		ev, err := stream.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Errorf("events of %s/%s after %q: %v (states so far %v)", user, name, lastEventID, err, got)
			return lastID
		}
		if ev.SpawnID != spawnID {
			t.Errorf("event %s has spawn id %q, want %q", ev.ID, ev.SpawnID, spawnID)
		}
		if ev.ID == lastID || ev.ID == lastEventID {
			t.Errorf("event id %q repeated", ev.ID)
		}
		lastID = ev.ID
		if len(got) == 0 || got[len(got)-1] != ev.State {
			got = append(got, ev.State)
		}
		if ev.State == final && final != v1.StateStopped && final != v1.StateFailed {
			break // a live stream; stop reading here
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events of %s/%s after %q (-want +got):\n%s", user, name, lastEventID, diff)
	}
	return lastID
}
