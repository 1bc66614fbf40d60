package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
	"github.com/gpubroker/gpubroker/limiter/hook/podhook"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

// notebookImage is the image of the notebook profiles: the pod runner
// knows it, with nothing of its own (the profiles' commands name
// Debian's Jupyter).
const notebookImage = "example.invalid/jupyter:1"

// jupyterArgs start Debian's classic notebook server as a pod runs it:
// on the pod's IP, under the base URL the broker's proxy uses, taking the
// token from JUPYTER_TOKEN (the server's Secret).
const jupyterArgs = `[--no-browser, --allow-root, "--ip=$(GPUBROKER_POD_IP)", --port=8888, "--NotebookApp.base_url=$(GPUBROKER_BASE_URL)", --NotebookApp.allow_remote_access=True, --NotebookApp.port_retries=0]`

// notebookProfiles is the catalog of brokers whose pods run as real
// processes: jupyter (a real notebook server), crashing (a notebook
// command that fails at start, with a message) and refusing (a notebook
// that does not take the spawn's token).
var notebookProfiles = `
profiles:
  - name: jupyter
    displayName: Jupyter
    image: ` + notebookImage + `
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 8192, computePercent: 10, computeLimitPercent: 50}
    command: [/usr/bin/python3, -m, notebook]
    args: ` + jupyterArgs + `
  - name: crashing
    displayName: Crashing
    image: ` + notebookImage + `
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 8192, computePercent: 10, computeLimitPercent: 50}
    command: [/bin/sh, -c, "echo 'starting'; echo 'notebook: cannot read /home/jovyan/.jupyter/jupyter_notebook_config.py: permission denied' >&2; exit 3"]
  - name: refusing
    displayName: Refusing
    image: ` + notebookImage + `
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 8192, computePercent: 10, computeLimitPercent: 50}
    command: [/usr/bin/python3, -m, notebook, --NotebookApp.token=not-the-spawns-token]
    args: ` + jupyterArgs + `
quotas:
  defaultUser: {servers: 2}
`

// runnerCIDRs counts the pod runners of this test process: each gets a
// loopback /24 of its own (127.66.0.0/24, 127.66.1.0/24, …), so parallel
// tests' notebooks never meet on one address (the runner also skips an
// address whose port is taken, for other processes).
var runnerCIDRs atomic.Int32

func nextRunnerCIDR() netip.Prefix {
	n := runnerCIDRs.Add(1) - 1
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 66 + byte(n/256), byte(n % 256), 0}), 24)
}

// newRunnerNodes starts a pod runner for t over the shared cluster: n
// nodes of its own (not kwok's) whose pods in namespace ns run as local
// processes, with the broker's default host root mapped under a temp dir
// where the node's hook directory is laid out (as the agent's install step
// would). Every notebook pod mounts the limiter, so its process runs under
// the real hook over the stub driver in its slice (podhook: podrun's
// mount namespace, the quota written by the agent's code from the pod's
// annotations). The runner stops, and its processes with it, when t ends.
func newRunnerNodes(t testing.TB, c *harness.Cluster, ns string, n int) (*runner.Runner, []string, *nodeHook) {
	t.Helper()
	testdeps.Need(t, "py:notebook")
	testdeps.Need(t, "py:ipykernel")
	stubtest.Need(t)
	base := harness.UniqueName(t.Name())
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-run-%d", base, i)
	}
	dir := t.TempDir()
	host := filepath.Join(dir, "node")
	hook := &nodeHook{dir: filepath.Join(host, "var", "lib", "gpubroker", v1.HostHookSubdir)}
	if err := hook.install(); err != nil {
		t.Fatal(err)
	}
	limiter, err := podhook.New(filepath.Join(dir, "stub.state"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(runner.Config{
		Client: c.Client, Namespace: ns, Nodes: names, Dir: filepath.Join(dir, "pods"), HostRoot: host, CIDR: nextRunnerCIDR(),
		Images:  map[string]runner.Image{notebookImage: {}, hubImage: hubImageRun},
		Backoff: 500 * time.Millisecond, MaxBackoff: 5 * time.Second, StopGrace: 5 * time.Second,
		ProbeInterval: 100 * time.Millisecond,
		Limiter:       &runner.Limiter{Wrap: limiter.Wrap, Env: limiter.Env()},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pod runner: %v", err)
		}
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer dcancel()
		if err := c.DeleteNodes(dctx, names...); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	err = harness.Poll(t.Context(), 50*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		for _, name := range names {
			if _, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false, err.Error(), nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatalf("runner nodes: %v", err)
	}
	return r, names, hook
}

// nodeHook is the runner nodes' hook directory, which every notebook pod
// mounts (hostPath, type Directory): while it is missing, pods wait in
// ContainerCreating, as on a node whose agent has not installed the hook.
type nodeHook struct{ dir string }

// install lays out the directory and its preload file.
func (h *nodeHook) install() error {
	if err := os.MkdirAll(h.dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(h.dir, "ld.so.preload"), nil, 0o644)
}

// remove takes it away again.
func (h *nodeHook) remove() error { return os.RemoveAll(h.dir) }
