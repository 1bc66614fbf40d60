// Command gpubroker-agent is the gpubroker node agent: one per GPU node (a
// DaemonSet with hostPID and the host root mounted). It only wires
// configuration to limiter/agent; see that package for what it does.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, warnings, err := Load(args, os.Environ())
	switch {
	case errors.Is(err, cliconfig.ErrHelp):
		fmt.Fprint(os.Stdout, usage())
		return 0
	case errors.Is(err, cliconfig.ErrVersion):
		fmt.Fprint(os.Stdout, cliconfig.BuildInfo("gpubroker-agent"))
		return 0
	}
	for _, w := range warnings {
		fmt.Fprintf(os.Stderr, "gpubroker-agent: warning: %s\n", w)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpubroker-agent: invalid configuration:\n  - %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  - "))
		return 2
	}
	if cfg.CheckConfig {
		fmt.Fprintln(os.Stdout, "gpubroker-agent: configuration is valid")
		return 0
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated in Load
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log.With("component", "client-go"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("gpubroker-agent stopped", "err", err)
		return 1
	}
	log.Info("gpubroker-agent stopped")
	return 0
}

// serve builds the agent and runs it with its metrics server until ctx ends.
func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := agentstore.New(rdb, cfg.Redis.Prefix, agentstore.WithMaxLen(cfg.SampleMaxLen))

	kube, err := cfg.Kube.Clientset("gpubroker-agent/" + cliconfig.Version())
	if err != nil {
		return err
	}
	pods := agent.NewPodWatcher(kube, cfg.Agent.Node, func(err error) {
		log.Warn("pod ignored", "err", err)
	})

	var opts []nvml.LibraryOption
	if cfg.NVMLLibrary != "" {
		opts = append(opts, nvml.WithLibraryPath(cfg.NVMLLibrary))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := agent.New(cfg.Agent, agent.Deps{
		NVML:    nvml.New(opts...),
		Samples: store,
		Quotas:  store,
		Audit:   store,
		Pods:    pods,
		Proc:    agent.ProcFS{Root: cfg.ProcRoot},
		Metrics: reg,
		Log:     log,
	})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !pods.Synced() {
			http.Error(w, "pod cache not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n")) // a failed write to a gone client needs no handling
	})
	srv := &http.Server{Addr: cfg.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second}

	log.Info("gpubroker-agent starting", "node", cfg.Agent.Node, "metrics_addr", cfg.MetricsAddr,
		"sample_interval", cfg.Agent.SampleInterval.String(), "enforce", cfg.EnforceMode)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return pods.Run(ctx) })
	g.Go(func() error {
		if err := a.Run(ctx); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("metrics server shutdown: %w", err)
		}
		return nil
	})
	return g.Wait()
}
