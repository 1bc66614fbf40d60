// Command gpubroker-agent is the gpubroker node agent: one per GPU node (a
// DaemonSet with hostPID and the host root mounted). It only wires
// configuration to limiter/agent; see that package for what it does.
package main

import (
	"context"
	"errors"
	"flag"
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
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := Load(args, os.Getenv, os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if cfg.CheckConfig {
		fmt.Fprintln(os.Stdout, "configuration is valid")
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
	rdb, err := redisClient(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := agentstore.New(rdb, cfg.RedisPrefix, agentstore.WithMaxLen(cfg.SampleMaxLen))

	kube, err := kubeClient(cfg.Kubeconfig)
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

// redisClient builds the client: a URL or Sentinel, with the password file
// applied and ContextTimeoutEnabled so per-operation deadlines reach the
// socket.
func redisClient(cfg Config) (redis.UniversalClient, error) {
	password := ""
	if cfg.RedisPasswordFile != "" {
		b, err := os.ReadFile(cfg.RedisPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("redis password file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	if cfg.RedisSentinelMaster != "" {
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: cfg.RedisSentinelMaster, SentinelAddrs: strings.Split(cfg.RedisSentinelAddrs, ","),
			Password: password, ContextTimeoutEnabled: true,
			DialTimeout: defaultTimeout, ReadTimeout: defaultTimeout, WriteTimeout: defaultTimeout,
		}), nil
	}
	o, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if password != "" {
		o.Password = password
	}
	o.ContextTimeoutEnabled = true
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = defaultTimeout, defaultTimeout, defaultTimeout
	return redis.NewClient(o), nil
}

// kubeClient uses kubeconfig, or the in-cluster config when it is "".
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}
