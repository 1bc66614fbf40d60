// Command gpubroker-agent is the gpubroker node agent: one per GPU node (a
// DaemonSet with hostPID and the host root mounted). It only wires
// configuration to limiter/agent; see that package for what it does.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

func run(args, environ []string, stdout, stderr io.Writer) int {
	cfg, warnings, err := Load(args, environ)
	var deps []cliconfig.Dependency
	if cfg.Connect {
		deps = dependencies(cfg)
	}
	front := cliconfig.Front{Program: "gpubroker-agent", Usage: usage, Stdout: stdout, Stderr: stderr}
	if code, done := front.Settle(context.Background(), warnings, err, cfg.CheckConfig || cfg.Connect, deps); done {
		return code
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated in Load
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
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

	kube, err := cfg.Kube.Clientset(userAgent)
	if err != nil {
		return err
	}
	pods := agent.NewPodWatcher(kube, cfg.Agent.Node, func(err error) {
		log.Warn("pod ignored", "err", err)
	}, agent.WithNamespace(cfg.Namespace))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := agent.New(cfg.Agent, agent.Deps{
		NVML:    nvmlLibrary(cfg),
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
		"sample_interval", cfg.Agent.SampleInterval.String(), "enforce", cfg.EnforceMode, "enforce_compute", cfg.EnforceComputeMode)
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

// userAgent is the agent's user agent at the API server.
var userAgent = "gpubroker-agent/" + cliconfig.Version()

// nvmlLibrary is NVML from --nvml-library, or the system's.
func nvmlLibrary(cfg Config) nvml.Interface {
	var opts []nvml.LibraryOption
	if cfg.NVMLLibrary != "" {
		opts = append(opts, nvml.WithLibraryPath(cfg.NVMLLibrary))
	}
	return nvml.New(opts...)
}

// dependencies are what --connect contacts: Redis (PING), the API server
// (this node's pods, as the agent watches them) and NVML (loaded,
// initialised and asked for its device count).
func dependencies(cfg Config) []cliconfig.Dependency {
	where := cfg.Kube.Where() + ", node " + cfg.Agent.Node
	if cfg.Namespace != "" {
		where += ", namespace " + cfg.Namespace
	}
	return []cliconfig.Dependency{
		cfg.Redis.Dependency(),
		{Name: "kubernetes", Where: where, Check: func(ctx context.Context) error {
			kube, err := cfg.Kube.Clientset(userAgent)
			if err != nil {
				return err
			}
			_, err = kube.CoreV1().Pods(cfg.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + cfg.Agent.Node, Limit: 1})
			if err != nil {
				return fmt.Errorf("list this node's pods: %w", err)
			}
			return nil
		}},
		{Name: "nvml", Where: cmp.Or(cfg.NVMLLibrary, "the system's libnvidia-ml.so.1"), Check: func(context.Context) error {
			lib := nvmlLibrary(cfg)
			if ret := lib.Init(); ret != nvml.SUCCESS {
				return fmt.Errorf("init: %w", ret)
			}
			defer lib.Shutdown()
			if _, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS {
				return fmt.Errorf("device count: %w", ret)
			}
			return nil
		}},
	}
}
