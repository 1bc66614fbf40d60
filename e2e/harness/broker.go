package harness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BrokerOptions configure one `gpubroker serve` process.
type BrokerOptions struct {
	// Binary is the gpubroker executable.
	Binary string
	// Dir receives the profiles file, the hub token file and broker.log.
	Dir string
	// RedisURL, Kubeconfig, Namespace, IssuerURL and Audience map to
	// --redis-url, --kubeconfig, --namespace, --oidc-issuer and
	// --oidc-audience.
	RedisURL   string
	Kubeconfig string
	// RedisSentinelMaster and RedisSentinelAddrs, when set, map to
	// --redis-sentinel-master and --redis-sentinel-addrs instead of
	// --redis-url.
	RedisSentinelMaster string
	RedisSentinelAddrs  []string
	Namespace           string
	IssuerURL           string
	Audience            string
	// ProfilesYAML is written to Dir and passed as --profiles-file.
	ProfilesYAML string
	// HubToken is written to Dir and passed as --hub-token-file; "" leaves the
	// flag out.
	HubToken string
	// ReconcileInterval and OrphanGrace map to --reconcile-interval and
	// --orphan-grace; zero leaves the broker's default.
	ReconcileInterval time.Duration
	OrphanGrace       time.Duration
	// Args are more flags, appended last.
	Args []string
}

// Broker is a gpubroker serve process on a fixed loopback port that can be
// killed and started again on the same port. Its methods are safe for
// concurrent use.
type Broker struct {
	// URL is the broker's base URL, http://127.0.0.1:<port>.
	URL string
	// MetricsURL is the base URL of its metrics listener
	// (--metrics-listen), http://127.0.0.1:<port>; /metrics is there.
	MetricsURL string
	// LogPath is the file holding the output of every start.
	LogPath string

	bin  string
	args []string
	env  []string

	mu   sync.Mutex
	proc *Process // nil while stopped
}

// StartBroker writes the broker's files, starts it and waits up to 60 s for
// GET /readyz to answer 200. On error the process is stopped and the error
// carries the log tail. The caller must call Stop.
func StartBroker(ctx context.Context, o BrokerOptions) (*Broker, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	metricsPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	profiles := filepath.Join(o.Dir, "profiles.yaml")
	if err := os.WriteFile(profiles, []byte(o.ProfilesYAML), 0o600); err != nil {
		return nil, fmt.Errorf("write profiles: %w", err)
	}
	b := &Broker{
		URL:        fmt.Sprintf("http://127.0.0.1:%d", port),
		MetricsURL: fmt.Sprintf("http://127.0.0.1:%d", metricsPort),
		LogPath:    filepath.Join(o.Dir, "broker.log"),
		bin:        o.Binary,
		env:        Environ(),
	}
	b.args = []string{"serve",
		fmt.Sprintf("--listen=127.0.0.1:%d", port),
		fmt.Sprintf("--metrics-listen=127.0.0.1:%d", metricsPort),
		"--kubeconfig=" + o.Kubeconfig,
		"--namespace=" + o.Namespace,
		"--oidc-issuer=" + o.IssuerURL,
		"--oidc-audience=" + o.Audience,
		"--profiles-file=" + profiles,
	}
	if o.RedisSentinelMaster != "" {
		b.args = append(b.args, "--redis-sentinel-master="+o.RedisSentinelMaster, "--redis-sentinel-addrs="+strings.Join(o.RedisSentinelAddrs, ","))
	} else {
		b.args = append(b.args, "--redis-url="+o.RedisURL)
	}
	if o.HubToken != "" {
		hub := filepath.Join(o.Dir, "hub-token")
		if err := os.WriteFile(hub, []byte(o.HubToken+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("write hub token: %w", err)
		}
		b.args = append(b.args, "--hub-token-file="+hub)
	}
	if o.ReconcileInterval > 0 {
		b.args = append(b.args, "--reconcile-interval="+o.ReconcileInterval.String())
	}
	if o.OrphanGrace > 0 {
		b.args = append(b.args, "--orphan-grace="+o.OrphanGrace.String())
	}
	b.args = append(b.args, o.Args...)
	if err := b.Start(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// Environ is the test process's environment without GPUBROKER_* variables,
// so that only flags configure a gpubroker process started with it.
func Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUBROKER_") {
			env = append(env, kv)
		}
	}
	return env
}

// Start starts the broker if it is not running and waits up to 60 s for
// /readyz; on failure it kills the process and returns the log tail.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc != nil {
		select {
		case <-b.proc.Exited():
		default:
			return nil
		}
	}
	p, err := StartProcess("gpubroker", b.LogPath, b.env, b.bin, b.args...)
	if err != nil {
		return err
	}
	b.proc = p
	if err := WaitReady(ctx, b.URL, p, 60*time.Second); err != nil {
		_ = p.Kill()
		b.proc = nil
		return fmt.Errorf("gpubroker: %w\n--- %s, last 40 lines:\n%s", err, b.LogPath, TailFile(b.LogPath, 40))
	}
	return nil
}

// WaitReady polls baseURL/readyz every 50 ms until it answers 200, p exits
// (when p is not nil) or timeout passes.
func WaitReady(ctx context.Context, baseURL string, p *Process, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	var exited <-chan struct{}
	if p != nil {
		exited = p.Exited()
	}
	err := Poll(ctx, 50*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		select {
		case <-exited:
			return false, "", fmt.Errorf("exited before ready: %w", p.ExitErr())
		default:
		}
		body, status, err := get(ctx, hc, baseURL+"/readyz", "")
		if err != nil {
			return false, err.Error(), nil
		}
		return status == http.StatusOK, fmt.Sprintf("%d %s", status, lastLines(body, 3)), nil
	})
	if err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	return nil
}

// Kill sends SIGKILL to the broker (a crash) and waits until it is reaped.
// Start brings it back on the same port.
func (b *Broker) Kill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return nil
	}
	err := b.proc.Kill()
	b.proc = nil
	return err
}

// Stop asks the broker to shut down (SIGTERM, 15 s grace, then SIGKILL) and
// waits until it is reaped. It also reports a process that had already
// exited on its own.
func (b *Broker) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return nil
	}
	p := b.proc
	b.proc = nil
	select {
	case <-p.Exited():
		if err := p.ExitErr(); err != nil {
			return fmt.Errorf("gpubroker had exited: %w", err)
		}
		return errors.New("gpubroker had exited with status 0 before Stop")
	default:
	}
	return p.Stop(15 * time.Second)
}

// Shutdown asks the broker to shut down (SIGTERM) and waits up to grace
// for it to exit by itself, then kills it. It returns how long the exit
// took and an error when the broker did not exit within grace or exited
// with a failure: a graceful shutdown exits 0 within its budget.
func (b *Broker) Shutdown(grace time.Duration) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return 0, errors.New("gpubroker is not running")
	}
	p := b.proc
	b.proc = nil
	start := time.Now()
	if err := p.signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.Exited():
		took := time.Since(start)
		p.signalGroup(syscall.SIGKILL) // stray children of the group
		if err := p.ExitErr(); err != nil {
			return took, fmt.Errorf("gpubroker exited after SIGTERM with %w", err)
		}
		return took, nil
	case <-timer.C:
		_ = p.Kill()
		return time.Since(start), fmt.Errorf("gpubroker did not exit within %s of SIGTERM; killed", grace)
	}
}

// Pid returns the broker's process id, 0 while it is stopped.
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return 0
	}
	return b.proc.Pid()
}

// LogTail returns the last n lines of the broker's log.
func (b *Broker) LogTail(n int) string { return TailFile(b.LogPath, n) }
