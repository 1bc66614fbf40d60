package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// HubPython is the interpreter that runs JupyterHub: Debian's, which
// imports Debian's jupyterhub (a python3 on PATH may be another one).
const HubPython = "/usr/bin/python3"

// HubOptions configure one JupyterHub process (Debian's jupyterhub 3.0 with
// its configurable-http-proxy).
type HubOptions struct {
	// Dir holds the hub's state (config, sqlite database, cookie secret,
	// pid files) and hub.log; it survives restarts.
	Dir string
	// Config is Python appended to the harness's own configuration (ports,
	// paths), for example the authenticator and the spawner class.
	Config string
	// Env is added to the environment (PYTHONPATH of a spawner class).
	Env []string
}

// Hub is a JupyterHub process on fixed loopback ports that can be killed
// and started again on the same ports and state. Its methods are safe for
// concurrent use.
type Hub struct {
	// URL is the public proxy's base URL, http://127.0.0.1:<port>; the
	// hub's pages are under /hub/, its REST API under /hub/api/.
	URL string
	// HubURL is where the hub itself listens (hub_bind_url), the address a
	// single-user server reaches it at (hub_connect_url).
	HubURL string
	// LogPath is the file holding the output of every start (the proxy's
	// included).
	LogPath string

	dir        string
	configPath string
	proxyPID   string
	env        []string

	mu   sync.Mutex
	proc *Process // nil while stopped
}

// StartHub writes the hub's configuration into o.Dir, starts it and waits
// until its REST API answers through the proxy. The caller must call Stop.
func StartHub(ctx context.Context, o HubOptions) (*Hub, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("hub state directory: %w", err)
	}
	ports := make([]int, 3)
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	h := &Hub{
		URL:        fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		HubURL:     fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		LogPath:    filepath.Join(o.Dir, "hub.log"),
		dir:        o.Dir,
		configPath: filepath.Join(o.Dir, "jupyterhub_config.py"),
		proxyPID:   filepath.Join(o.Dir, "proxy.pid"),
		// The installed Node does not search Debian's module folder; without
		// NODE_PATH the proxy cannot load its modules and the hub exits
		// (JUPYTERHUB-RIG.md §2).
		env: append(append(Environ(), "NODE_PATH=/usr/share/nodejs", "PYTHONDONTWRITEBYTECODE=1"), o.Env...),
	}
	py := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	cfg := fmt.Sprintf(`# Written by the e2e harness (e2e/harness/hub.go).
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = %s
c.JupyterHub.hub_bind_url = %s
c.JupyterHub.hub_connect_url = %s
c.ConfigurableHTTPProxy.api_url = %s
c.ConfigurableHTTPProxy.pid_file = %s
c.JupyterHub.pid_file = %s
c.JupyterHub.db_url = %s
c.JupyterHub.cookie_secret_file = %s
# Servers outlive the hub: a restarted hub finds them again.
c.JupyterHub.cleanup_servers = False
%s
`, py(h.URL), py(h.HubURL), py(h.HubURL), py(fmt.Sprintf("http://127.0.0.1:%d", ports[2])), py(h.proxyPID),
		py(filepath.Join(o.Dir, "jupyterhub.pid")), py("sqlite:///"+filepath.Join(o.Dir, "jupyterhub.sqlite")),
		py(filepath.Join(o.Dir, "cookie_secret")), o.Config)
	if err := os.WriteFile(h.configPath, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("write hub config: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// Start starts the hub if it is not running and waits up to 60 s until
// GET /hub/api answers 200 through the proxy; on failure it kills the
// process and returns the log tail.
func (h *Hub) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.proc != nil {
		select {
		case <-h.proc.Exited():
		default:
			return nil
		}
	}
	// At start the hub kills whatever process now has the pid in a stale
	// proxy pid file (JUPYTERHUB-RIG.md §2).
	if err := os.Remove(h.proxyPID); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove the proxy's pid file: %w", err)
	}
	p, err := startProcessIn(h.dir, "jupyterhub", h.LogPath, h.env, HubPython, "-m", "jupyterhub", "-f", h.configPath)
	if err != nil {
		return err
	}
	h.proc = p
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	err = Poll(ctx, 50*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		select {
		case <-p.Exited():
			return false, "", fmt.Errorf("exited before ready: %w", p.ExitErr())
		default:
		}
		body, status, err := get(ctx, hc, h.URL+"/hub/api", "")
		if err != nil {
			return false, err.Error(), nil
		}
		return status == http.StatusOK, fmt.Sprintf("%d %s", status, lastLines(body, 3)), nil
	})
	if err != nil {
		_ = p.Kill()
		h.proc = nil
		return fmt.Errorf("jupyterhub not ready: %w\n--- %s, last 40 lines:\n%s", err, h.LogPath, TailFile(h.LogPath, 40))
	}
	return nil
}

// Kill sends SIGKILL to the hub's process group and to its proxy (a
// crash of the machine they share), waits until the hub is reaped and the
// public port is free again. Start brings them back.
//
// The proxy runs in a process group of its own, so it would outlive the
// hub; its pid comes from the proxy's pid file, read just before the kill.
func (h *Hub) Kill() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.proc == nil {
		return nil
	}
	proxy := 0
	if b, err := os.ReadFile(h.proxyPID); err == nil {
		proxy, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	err := h.proc.Kill()
	h.proc = nil
	if proxy > 1 {
		if kerr := syscall.Kill(proxy, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
			err = errors.Join(err, fmt.Errorf("kill the hub's proxy (pid %d): %w", proxy, kerr))
		}
	}
	// The orphaned proxy is reaped by whoever adopts it: wait for its port.
	addr := strings.TrimPrefix(h.URL, "http://")
	perr := Poll(context.Background(), 20*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true, "", nil
		}
		c.Close()
		return false, addr + " still accepts connections", nil
	})
	return errors.Join(err, perr)
}

// Stop asks the hub to shut down (SIGTERM to its group, 15 s grace, then
// SIGKILL) and waits until it is reaped. Servers keep running
// (cleanup_servers is off).
func (h *Hub) Stop() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.proc == nil {
		return nil
	}
	p := h.proc
	h.proc = nil
	return p.Stop(15 * time.Second)
}

// LogTail returns the last n lines of the hub's log.
func (h *Hub) LogTail(n int) string { return TailFile(h.LogPath, n) }
