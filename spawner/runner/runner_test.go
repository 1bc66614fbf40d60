package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/spawner"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

// helperEnv makes the test binary act as a container process (helperMain)
// instead of running the tests.
const helperEnv = "RUNNER_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	goleak.VerifyTestMain(m)
}

// report is what a serving helper answers on GET /.
type report struct {
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// helperMain is a container process: "serve" listens on
// $GPUBROKER_POD_IP:8888 and answers GET / with a report until SIGTERM;
// "fail" writes lines and exits 3; "exit0" exits at once with 0.
func helperMain(mode string) int {
	switch mode {
	case "fail":
		for i := range 100 {
			fmt.Fprintf(os.Stderr, "line %d\n", i)
		}
		fmt.Fprintln(os.Stderr, "boom: the notebook cannot start")
		return 3
	case "exit0":
		return 0
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv(v1.EnvPodIP), "8888"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	wd, _ := os.Getwd()
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_ = json.NewEncoder(w).Encode(report{Args: os.Args, Env: os.Environ(), Dir: wd})
		}))
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	fmt.Println("got SIGTERM, bye")
	return 0
}

const (
	namespace = "nb"
	node      = "local-node"
	image     = "test/helper:1"
	hostRoot  = "/var/lib/gpubroker" // the spawner's default, inside the runner's HostRoot
)

// fixture is a fake cluster with a running Runner.
type fixture struct {
	t     *testing.T
	cs    *fake.Clientset
	r     *runner.Runner
	host  string // the runner's HostRoot
	cfg   spawner.Config
	stop  context.CancelFunc
	done  chan error
	count int
}

func newFixture(t *testing.T, mutate func(*runner.Config)) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{t: t, cs: fake.NewClientset(), host: filepath.Join(dir, "host"),
		cfg: spawner.Config{Namespace: namespace, Tolerations: nil}.WithDefaults()}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := runner.Config{
		Client: f.cs, Namespace: namespace, Nodes: []string{node}, Dir: filepath.Join(dir, "run"), HostRoot: f.host,
		Images:  map[string]runner.Image{image: {Entrypoint: []string{self}}},
		Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond, StopGrace: 5 * time.Second,
		ProbeInterval: 20 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	f.r, err = runner.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop, f.done = cancel, make(chan error, 1)
	go func() { f.done <- f.r.Run(ctx) }()
	t.Cleanup(func() {
		f.stop()
		if err := <-f.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	f.waitNodeReady()
	return f
}

func (f *fixture) waitNodeReady() {
	f.t.Helper()
	f.eventually("node registered and Ready", func() (bool, string) {
		n, err := f.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(n.Status.Conditions) == 1 && n.Status.Conditions[0].Status == corev1.ConditionTrue, fmt.Sprint(n.Status.Conditions)
	})
}

// installHook lays out what the node agent's install step leaves on a node:
// the hook directory and its preload file.
func (f *fixture) installHook() {
	f.t.Helper()
	hook := filepath.Join(f.host, hostRoot, v1.HostHookSubdir)
	if err := os.MkdirAll(hook, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hook, "ld.so.preload"), []byte(v1.PodHookLib+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// createPod creates the broker's pod for server name running the helper in
// mode, with secret env SECRET_X, and returns it.
func (f *fixture) createPod(name, mode string, command, args []string, withSecret bool) *corev1.Pod {
	f.t.Helper()
	f.count++
	spec := spawner.Spec{
		User: "ada", Server: name, SpawnID: fmt.Sprintf("spawn-%d", f.count), Profile: "small", Image: image,
		Slice:   v1.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10},
		GPU:     v1.GPURef{UUID: "GPU-1", Node: node},
		Env:     map[string]string{helperEnv: mode, "GREETING": "hello from $(GPUBROKER_POD_IP)"},
		Command: command, Args: args, SecretEnv: true,
	}
	pod, err := spawner.Pod(f.cfg, spec)
	if err != nil {
		f.t.Fatal(err)
	}
	pod.UID = types.UID(fmt.Sprintf("uid-%d", f.count))
	ctx := context.Background()
	if withSecret {
		if _, err := f.cs.CoreV1().Secrets(namespace).Create(ctx, spawner.Secret(f.cfg, spec, map[string]string{"SECRET_X": "s3cret"}), metav1.CreateOptions{}); err != nil {
			f.t.Fatal(err)
		}
	}
	if _, err := f.cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	return pod
}

func (f *fixture) pod(name string) *corev1.Pod {
	f.t.Helper()
	p, err := f.cs.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

// waitPhase waits until spawner.Classify reads want from the pod, and
// returns the pod and Classify's message.
func (f *fixture) waitPhase(name string, want spawner.Phase) (*corev1.Pod, string) {
	f.t.Helper()
	var pod *corev1.Pod
	var msg string
	f.eventually("pod "+name+" "+string(want), func() (bool, string) {
		pod = f.pod(name)
		var phase spawner.Phase
		phase, msg = spawner.Classify(pod, time.Now(), f.cfg)
		return phase == want, fmt.Sprintf("%s: %s (status %+v)", phase, msg, pod.Status.ContainerStatuses)
	})
	return pod, msg
}

func (f *fixture) eventually(what string, cond func() (bool, string)) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: not within 20s; last: %s", what, last)
		}
		<-tick.C
	}
}

func get(t *testing.T, url string) (report, error) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		return report{}, err
	}
	defer resp.Body.Close()
	var r report
	err = json.NewDecoder(resp.Body).Decode(&r)
	return r, err
}

func envOf(r report, name string) (string, bool) {
	for _, kv := range r.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// TestRunsThePodAsALocalProcess runs a broker pod: it waits for the hook's
// hostPath volumes like a kubelet, then serves on its pod IP with the
// pod's environment (Secret values, downward API, $(VAR) expansion), its
// own home and working directory, and is Ready and running for the broker.
func TestRunsThePodAsALocalProcess(t *testing.T) {
	f := newFixture(t, nil)
	name := spawner.PodName("ada", "nb")
	f.createPod("nb", "serve", nil, []string{"--listen=$(GPUBROKER_POD_IP)", "$$(kept)"}, true)

	_, msg := f.waitPhase(name, spawner.PhaseStarting)
	cs := f.pod(name).Status.ContainerStatuses[0]
	if cs.State.Waiting == nil || !strings.Contains(cs.State.Waiting.Message, "gpubroker-hook") {
		t.Errorf("before the hook is installed: %s (%+v), want waiting for the hook volume", msg, cs.State)
	}
	f.installHook()
	pod, _ := f.waitPhase(name, spawner.PhaseRunning)
	ip := pod.Status.PodIP
	if !runner.DefaultCIDR.Contains(mustAddr(t, ip)) {
		t.Errorf("pod IP %s is outside %s", ip, runner.DefaultCIDR)
	}
	url := spawner.URL(pod)
	if url != "http://"+net.JoinHostPort(ip, "8888") {
		t.Errorf("URL %q", url)
	}
	r, err := get(t, url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	wantEnv := map[string]string{
		"SECRET_X":    "s3cret",
		v1.EnvPodIP:   ip,
		v1.EnvBaseURL: spawner.BaseURL("ada", "nb"),
		"GREETING":    "hello from " + ip,
		"HOSTNAME":    name,
	}
	for k, want := range wantEnv {
		if got, _ := envOf(r, k); got != want {
			t.Errorf("env %s = %q, want %q", k, got, want)
		}
	}
	if home, _ := envOf(r, "HOME"); home != r.Dir || !strings.HasPrefix(home, filepath.Dir(f.host)) {
		t.Errorf("HOME %q, working directory %q: want the pod's own directory", home, r.Dir)
	}
	if got := r.Args[1:]; !slices.Equal(got, []string{"--listen=" + ip, "$(kept)"}) {
		t.Errorf("args %q: want $(VAR) expanded and $$ kept as $", got)
	}
	for _, v := range []string{"quota", "usage"} {
		if _, err := os.Stat(filepath.Join(f.host, hostRoot, v1.HostSlicesSubdir, "spawn-1", v)); err != nil {
			t.Errorf("the slice's %s directory was not created on the node: %v", v, err)
		}
	}
}

// TestFailingCommandCrashLoopsWithItsOutput checks that a container that
// exits with an error is restarted once at once and then backs off, and
// that the broker then reads a failure in the program's own words.
func TestFailingCommandCrashLoopsWithItsOutput(t *testing.T) {
	f := newFixture(t, nil)
	f.installHook()
	f.createPod("nb", "fail", nil, nil, true)
	pod, msg := f.waitPhase(spawner.PodName("ada", "nb"), spawner.PhaseFailed)
	if !strings.Contains(msg, "boom: the notebook cannot start") || !strings.Contains(msg, "exited with code 3") {
		t.Errorf("failure %q: want the exit code and the program's last words", msg)
	}
	cs := pod.Status.ContainerStatuses[0]
	if cs.RestartCount < 2 || cs.LastTerminationState.Terminated == nil || len(cs.LastTerminationState.Terminated.Message) > 2048 {
		t.Errorf("container status %+v: want at least two restarts and a message of at most 2048 bytes", cs)
	}
	if strings.Contains(cs.LastTerminationState.Terminated.Message, "line 19\n") {
		t.Errorf("message holds more than the last 80 lines")
	}
}

// TestKilledContainerRestartsThenCrashLoops kills a running container: the
// first time it is restarted and becomes ready again; killed again at once
// it backs off and the broker reads the kill.
func TestKilledContainerRestartsThenCrashLoops(t *testing.T) {
	f := newFixture(t, nil)
	f.installHook()
	name := spawner.PodName("ada", "nb")
	f.createPod("nb", "serve", nil, nil, true)
	f.waitPhase(name, spawner.PhaseRunning)
	if err := f.r.Signal(namespace, name, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.eventually("restarted and ready", func() (bool, string) {
		pod := f.pod(name)
		cs := pod.Status.ContainerStatuses[0]
		ph, _ := spawner.Classify(pod, time.Now(), f.cfg)
		return cs.RestartCount == 1 && ph == spawner.PhaseRunning, fmt.Sprintf("%+v", cs)
	})
	if _, err := get(t, spawner.URL(f.pod(name))); err != nil {
		t.Errorf("the restarted container does not serve: %v", err)
	}
	if err := f.r.Signal(namespace, name, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, msg := f.waitPhase(name, spawner.PhaseFailed)
	if !strings.Contains(msg, "killed by signal 9") {
		t.Errorf("failure %q: want the kill", msg)
	}
}

// TestCleanExitEndsThePod checks restartPolicy OnFailure: exit 0 ends the pod
// as Succeeded, which the broker reads as the notebook having exited.
func TestCleanExitEndsThePod(t *testing.T) {
	f := newFixture(t, nil)
	f.installHook()
	pod, msg := f.waitPhase(f.createPod("nb", "exit0", nil, nil, true).Name, spawner.PhaseFailed)
	if pod.Status.Phase != corev1.PodSucceeded || msg != "the notebook exited" {
		t.Errorf("phase %s, %q: want Succeeded, the notebook exited", pod.Status.Phase, msg)
	}
}

// TestContainersThatCannotStart covers an image the runner does not know,
// an executable that is not there, and a missing Secret that appears later.
func TestContainersThatCannotStart(t *testing.T) {
	f := newFixture(t, func(c *runner.Config) { c.Images["other/image:2"] = runner.Image{} })
	f.installHook()

	unknown := f.createPod("unknown", "serve", nil, nil, true)
	ctx := context.Background()
	p := f.pod(unknown.Name)
	p.Spec.Containers[0].Image = "nowhere/image:1" // as if the profile named it
	_ = f.cs.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
	p.ResourceVersion, p.UID, p.Name = "", "uid-unknown-2", spawner.PodName("ada", "unknown2")
	if _, err := f.cs.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, msg := f.waitPhase(p.Name, spawner.PhaseFailed); !strings.Contains(msg, "cannot use image nowhere/image:1") {
		t.Errorf("unknown image: %q", msg)
	}

	missing := f.createPod("noexec", "serve", []string{"no-such-notebook"}, nil, true)
	if _, msg := f.waitPhase(missing.Name, spawner.PhaseFailed); !strings.Contains(msg, `"no-such-notebook": executable file not found in $PATH`) {
		t.Errorf("missing executable: %q", msg)
	}

	late := f.createPod("late", "serve", nil, nil, false)
	f.eventually("waits for its Secret", func() (bool, string) {
		cs := f.pod(late.Name).Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CreateContainerConfigError" &&
			strings.Contains(cs[0].State.Waiting.Message, "not found"), fmt.Sprint(cs)
	})
	spec := spawner.Spec{User: "ada", Server: "late", SpawnID: "spawn-3"}
	if _, err := f.cs.CoreV1().Secrets(namespace).Create(ctx, spawner.Secret(f.cfg, spec, map[string]string{"SECRET_X": "x"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(late.Name, spawner.PhaseRunning)
}

// TestDeletedPodStopsItsProcess deletes a running pod: its process is
// stopped and its address no longer answers; Run's end stops the rest.
func TestDeletedPodStopsItsProcess(t *testing.T) {
	f := newFixture(t, nil)
	f.installHook()
	a := f.createPod("a", "serve", nil, nil, true)
	b := f.createPod("b", "serve", nil, nil, true)
	podA, _ := f.waitPhase(a.Name, spawner.PhaseRunning)
	podB, _ := f.waitPhase(b.Name, spawner.PhaseRunning)
	if podA.Status.PodIP == podB.Status.PodIP {
		t.Fatalf("two pods share IP %s", podA.Status.PodIP)
	}
	if err := f.cs.CoreV1().Pods(namespace).Delete(context.Background(), a.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("the deleted pod's process is gone", func() (bool, string) {
		_, err := get(t, spawner.URL(podA))
		return err != nil, fmt.Sprint(err)
	})
	f.eventually("no process left for the deleted pod", func() (bool, string) {
		err := f.r.Signal(namespace, a.Name, syscall.Signal(0))
		return errors.Is(err, runner.ErrNoProcess), fmt.Sprint(err)
	})
	f.stop()
	if err := <-f.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	f.done <- nil // for the cleanup
	if _, err := get(t, spawner.URL(podB)); err == nil {
		t.Errorf("a process still serves after Run returned")
	}
}

// TestLimiterWrapsPodsThatAskForIt checks that a container mounting the
// limiter's preload file runs through Limiter.Wrap with its slice's quota
// and usage host directories and the limiter's environment.
func TestLimiterWrapsPodsThatAskForIt(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var quota, usage string
	f := newFixture(t, func(c *runner.Config) {
		c.Limiter = &runner.Limiter{
			Wrap: func(_ *corev1.Pod, q, u string, argv []string) ([]string, error) {
				quota, usage = q, u
				return append([]string{self, "--wrapped-quota=" + q, "--wrapped-usage=" + u}, argv[1:]...), nil
			},
			Env: []string{"LD_PRELOAD=/hook/libgpulimit.so"},
		}
	})
	f.installHook()
	pod, _ := f.waitPhase(f.createPod("nb", "serve", nil, nil, true).Name, spawner.PhaseRunning)
	r, err := get(t, spawner.URL(pod))
	if err != nil {
		t.Fatal(err)
	}
	slice := filepath.Join(f.host, hostRoot, v1.HostSlicesSubdir, "spawn-1")
	want := []string{"--wrapped-quota=" + filepath.Join(slice, "quota"), "--wrapped-usage=" + filepath.Join(slice, "usage")}
	if !slices.Equal(r.Args[1:3], want) {
		t.Errorf("args %q, want %q first (wrap saw %s, %s)", r.Args, want, quota, usage)
	}
	if v, _ := envOf(r, "LD_PRELOAD"); v != "/hook/libgpulimit.so" {
		t.Errorf("LD_PRELOAD %q", v)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	_, err := runner.New(runner.Config{Dir: "relative"})
	for _, want := range []string{"no Kubernetes client", "no nodes", `dir "relative" is not absolute`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want %q", err, want)
		}
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("pod IP %q: %v", s, err)
	}
	return a
}

// TestPodIPsInUseAreSkipped holds the range's first address on the pod's
// port, as another runner's notebook would: the pod gets the next one.
func TestPodIPsInUseAreSkipped(t *testing.T) {
	cidr := netip.MustParsePrefix("127.68.3.0/24")
	taken, err := net.Listen("tcp", net.JoinHostPort(cidr.Addr().Next().String(), "8888"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	f := newFixture(t, func(c *runner.Config) { c.CIDR = cidr })
	f.installHook()
	pod, _ := f.waitPhase(f.createPod("nb", "serve", nil, nil, true).Name, spawner.PhaseRunning)
	if pod.Status.PodIP == cidr.Addr().Next().String() || !cidr.Contains(mustAddr(t, pod.Status.PodIP)) {
		t.Errorf("pod IP %s: want another address of %s than the taken one", pod.Status.PodIP, cidr)
	}
	if _, err := get(t, spawner.URL(pod)); err != nil {
		t.Errorf("the pod does not serve at its IP: %v", err)
	}
}
