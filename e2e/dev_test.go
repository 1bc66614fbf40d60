package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// devReadyWithin is the requirement for dev mode (gpubroker-dev).
const devReadyWithin = 10 * time.Second

var (
	bearerRE     = regexp.MustCompile(`Bearer ([A-Za-z0-9._~+/=-]+)`)
	serverPathRE = regexp.MustCompile(`/api/v1/users/([^/\s']+)/servers/([^/\s']+)$`)
)

// TestDevModeReadyAndPrintedCommandWorks starts gpubroker-dev on a free
// port, requires /readyz within 10 s, then runs the printed "create a server"
// curl command through bash and waits for that server to reach running.
// It needs only the gpubroker-dev binary (and curl), not the cluster tools;
// the binary is built without -race, as `go tool task dev` runs it.
func TestDevModeReadyAndPrintedCommandWorks(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("e2e tests do not run with -short")
	}
	testdeps.Need(t, "curl")
	ctx := t.Context()
	start := time.Now()
	base, port, logPath := startDev(t, devReadyWithin)
	t.Logf("gpubroker-dev ready in %s", time.Since(start).Round(time.Millisecond))

	var command string
	err := harness.Poll(ctx, 50*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
		b, err := os.ReadFile(logPath)
		if err != nil {
			return false, err.Error(), nil
		}
		command = createCommand(string(b))
		return command != "", "no curl line after \"Create a server\" yet", nil
	})
	if err != nil {
		t.Fatalf("printed create command: %v", err)
	}
	fields := strings.Fields(command)
	target, err := url.Parse(strings.Trim(fields[len(fields)-1], "'\""))
	if err != nil {
		t.Fatalf("command's URL: %v", err)
	}
	m := serverPathRE.FindStringSubmatch(target.Path)
	tok := bearerRE.FindStringSubmatch(command)
	if m == nil || tok == nil || target.Host != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("printed command does not PUT a server on %s with a bearer token: %s", base, command)
	}
	user, name := m[1], m[2]

	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "bash", "-c", command).Output()
	if err != nil {
		t.Fatalf("bash -c <printed command>: %v\n%s", err, out)
	}
	var created v1.Server
	if err := json.Unmarshal(out, &created); err != nil || created.SpawnID == "" {
		t.Fatalf("printed command's answer is not a created server: %q (%v)", out, err)
	}
	cl := &harness.Client{BaseURL: base, Token: tok[1]}
	s, err := cl.WaitServer(ctx, user, name, v1.StateRunning, 30*time.Second)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if s.SpawnID != created.SpawnID || s.GPU == nil || s.URL == "" || s.OpenURL != base+"/user/"+user+"/"+name+"/" {
		t.Errorf("running dev server %+v: want spawn %s, a GPU, a URL and its address through the proxy", s, created.SpawnID)
	}
	// Jupyter is installed here (e2e/testdeps), so the notebook is a real
	// one, reached through the broker's proxy with the same token.
	testdeps.Need(t, "py:notebook")
	var status struct {
		Started string `json:"started"`
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		code, err := cl.Do(ctx, "GET", "/user/"+user+"/"+name+"/api/status", nil, nil, &status)
		if err != nil {
			return false, err.Error(), nil
		}
		return code == 200 && status.Started != "", fmt.Sprintf("%d %+v", code, status), nil
	})
	if err != nil {
		t.Errorf("the dev notebook's own API through the proxy: %v", err)
	}
}

// startDev starts gpubroker-dev on a free loopback port with args and
// waits up to ready for /readyz; it returns the base URL, the port and the
// log's path. The process stops when t ends (its log tail is printed if t
// failed).
func startDev(t *testing.T, ready time.Duration, args ...string) (string, int, string) {
	t.Helper()
	bin := devBinary(t)
	port, err := harness.FreePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	logPath := filepath.Join(t.TempDir(), "dev.log")
	p, err := harness.StartProcess("gpubroker-dev", logPath, harness.Environ(), bin, append([]string{fmt.Sprintf("--listen=127.0.0.1:%d", port)}, args...)...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(15 * time.Second); err != nil {
			t.Errorf("stop dev: %v", err)
		}
		if t.Failed() {
			t.Logf("--- %s, last 60 lines:\n%s", logPath, harness.TailFile(logPath, 60))
		}
	})
	if err := harness.WaitReady(t.Context(), base, p, ready); err != nil {
		t.Fatalf("gpubroker-dev not ready within %s: %v", ready, err)
	}
	return base, port, logPath
}

// createCommand returns the first line starting (after spaces) with "curl "
// that follows a line containing "Create a server", trimmed; "" if none.
func createCommand(out string) string {
	seen := false
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "Create a server") {
			seen = true
			continue
		}
		if trimmed := strings.TrimLeft(line, " \t"); seen && strings.HasPrefix(trimmed, "curl ") {
			return strings.TrimSpace(trimmed)
		}
	}
	return ""
}

// TestDevModeWithJupyterHub tries the spawner class locally, as its README
// tells: gpubroker-dev with --hub-token-file and Debian's JupyterHub in
// front of it. The banner gives the hub's settings; a hub spawn (REST, as
// alice) runs a real jupyterhub-singleuser on dev mode's local pods, which
// answers through the hub's proxy; the hub stops it.
func TestDevModeWithJupyterHub(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("e2e tests do not run with -short")
	}
	testdeps.Need(t, "py:notebook")
	ctx := t.Context()
	tokenFile := filepath.Join(t.TempDir(), "hub-token")
	if err := os.WriteFile(tokenFile, []byte("dev-hub-"+harness.UniqueName("token")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _, logPath := startDev(t, 30*time.Second, "--hub-token-file="+tokenFile)
	err := harness.Poll(ctx, 50*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
		b, err := os.ReadFile(logPath)
		return err == nil && strings.Contains(string(b), `c.GPUBrokerSpawner.hub_token_file = "`+tokenFile+`"`), "the banner has no hub settings", nil
	})
	if err != nil {
		t.Errorf("banner: %v", err)
	}

	h := &hubEnv{}
	h.hub, h.service = startHub(t, base, tokenFile)
	if _, err := h.spawn(ctx, "alice", "small"); err != nil {
		t.Fatal(err)
	}
	if err := h.waitHubReady(ctx, "alice", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	status, body, err := h.hubGet(ctx, "/user/alice/api/status")
	if err != nil || status != 200 || !strings.Contains(string(body), "kernels") {
		t.Errorf("alice's dev notebook through the hub's proxy: %d %.300s %v", status, body, err)
	}
	h.stopAtHub(t, "alice")
}
