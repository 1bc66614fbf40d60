package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
	"github.com/gpubroker/gpubroker/broker/internal/metrics"
	"github.com/gpubroker/gpubroker/broker/internal/proxy"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

// The instrumentation reports through the interfaces its consumers declare.
var (
	_ servers.Metrics   = (*metrics.Broker)(nil)
	_ reconcile.Metrics = (*metrics.Broker)(nil)
	_ reclaim.Metrics   = (*metrics.Broker)(nil)
	_ httpapi.Metrics   = (*metrics.Broker)(nil)
	_ proxy.Metrics     = (*metrics.Broker)(nil)
)

// Metrics is the broker's instrumentation with the registry it is
// registered on, one per process.
type Metrics struct {
	*metrics.Broker
	Registry *prometheus.Registry
}

// NewMetrics registers the broker's series on a registry of their own,
// with the catalog's profiles (whose spawn series start at zero).
func NewMetrics(cfg config.Config, cat *catalog.Catalog) (*Metrics, error) {
	reg := prometheus.NewRegistry()
	var profiles []string
	if cat != nil {
		for _, p := range cat.Profiles() {
			profiles = append(profiles, p.Name)
		}
	}
	m, err := metrics.New(reg, metrics.Options{Version: cliconfig.Version(), UserLabels: cfg.MetricsUserLabels, Profiles: profiles})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &Metrics{Broker: m, Registry: reg}, nil
}

// fleetInterval bounds how old the fleet's series (servers by state, GPU
// allocation, agents' heartbeats) may be: they are read from Redis this
// often, or every reconcile interval when that is shorter.
const fleetInterval = 15 * time.Second

// recordFleet copies the fleet's state from Redis into the metrics at once
// and then every interval until ctx ends. A failed read is logged at debug
// level (the readiness checks report a Redis that does not answer) and
// leaves the previous values.
func recordFleet(ctx context.Context, store *redisstore.Store, agents *agentstore.Store, m *metrics.Broker, log *slog.Logger, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if fl, err := readFleet(ctx, store, agents); err != nil {
			if ctx.Err() == nil {
				log.DebugContext(ctx, "fleet metrics not updated", "err", err)
			}
		} else {
			m.SetFleet(fl)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// readFleet reads the GPUs with their allocation, the server records'
// states (not the whole records) and the agents' heartbeats.
func readFleet(ctx context.Context, store *redisstore.Store, agents *agentstore.Store) (metrics.Fleet, error) {
	gpus, err := store.GPUUsage(ctx)
	if err != nil {
		return metrics.Fleet{}, err
	}
	srvs, err := store.ListServerStates(ctx, "")
	if err != nil {
		return metrics.Fleet{}, err
	}
	nodes, err := agents.Nodes(ctx, time.Now())
	if err != nil && nodes == nil {
		return metrics.Fleet{}, err
	}
	var fl metrics.Fleet
	for _, g := range gpus {
		fl.GPUs = append(fl.GPUs, metrics.GPU{UUID: g.GPU.UUID, Node: g.GPU.Node, Model: g.GPU.Model,
			MemoryMiB: g.GPU.MemoryMiB, AllocatedMiB: g.AllocatedMiB, AllocatedComputePercent: g.AllocatedComputePercent,
			Slices: g.Slices, Healthy: g.GPU.Healthy})
	}
	for _, s := range srvs {
		ms := metrics.Server{User: s.User, State: string(s.State), Profile: s.Profile}
		if s.Allocation != nil {
			ms.MemoryMiB, ms.ComputePercent = s.Allocation.Slice.MemoryMiB, s.Allocation.Slice.ComputePercent
		}
		fl.Servers = append(fl.Servers, ms)
	}
	for _, n := range nodes {
		fl.Nodes = append(fl.Nodes, metrics.Node{Name: n.Node, LastHeartbeat: n.LastHeartbeat})
	}
	return fl, nil
}

// readinessInterval is how often the readiness checks run in the
// background for gpubroker_dependency_up (and the log), between probes.
const readinessInterval = 5 * time.Second

// watchReadiness runs the readiness checks (the same as /readyz) at once
// and every interval until ctx ends, recording each result in
// gpubroker_dependency_up. From delay after start on, a check that starts
// failing is logged as a warning and one that recovers as info, so a
// broker whose dependencies are down says so (once), and says when they
// are back.
func watchReadiness(ctx context.Context, log *slog.Logger, checks []httpapi.Checker, m *metrics.Broker, delay, interval time.Duration) error {
	start := time.Now()
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := map[string]bool{}
	for {
		for _, c := range checks {
			cctx, cancel := context.WithTimeout(ctx, httpapi.DefaultReadyTimeout)
			err := c.Check(cctx)
			cancel()
			if ctx.Err() != nil {
				return nil
			}
			m.SetDependencyUp(c.Name(), err == nil)
			logging := time.Since(start) >= delay
			switch {
			case err != nil && !failing[c.Name()] && logging:
				log.WarnContext(ctx, "not ready: a dependency does not answer; /readyz reports the same", "check", c.Name(), "err", err)
				failing[c.Name()] = true
			case err == nil && failing[c.Name()]:
				log.InfoContext(ctx, "ready again: the dependency answers", "check", c.Name())
				failing[c.Name()] = false
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// serveMetrics serves /metrics of gatherer on addr until ctx ends, then
// shuts down within timeout. An empty addr serves nothing.
func serveMetrics(ctx context.Context, addr string, gatherer prometheus.Gatherer, log *slog.Logger, timeout time.Duration) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(gatherer))
	log.Info("metrics listener started", "metrics_listen", ln.Addr().String())
	return serveUntil(ctx, "metrics server", newServer(mux, log), ln, timeout, log)
}

// servePprof serves Go's pprof handlers (pprofMux) on addr
// (listenPprof) until ctx ends; "" serves nothing.
func servePprof(ctx context.Context, addr string, log *slog.Logger, timeout time.Duration) error {
	if addr == "" {
		return nil
	}
	ln, err := listenPprof(addr)
	if err != nil {
		return err
	}
	log.Warn("pprof listener started: profiles and goroutine dumps of this process are served there", "debug_pprof_listen", ln.Addr().String())
	return serveUntil(ctx, "pprof server", newServer(pprofMux(), log), ln, timeout, log)
}

// listenPprof listens on addr, host:port; a host-less addr (":6060")
// binds to loopback only, since profiles and goroutine dumps are for the
// operator on the host, not for the network.
func listenPprof(addr string) (net.Listener, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof listener on %s: %w", addr, err)
	}
	return ln, nil
}

// pprofMux serves net/http/pprof's handlers under /debug/pprof/ (the
// index, cmdline, profile, symbol, trace and every named profile).
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
