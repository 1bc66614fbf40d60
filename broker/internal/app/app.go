// Package app is the broker's composition root: the only package that sees
// every concrete type. Run builds the parts from a validated config, runs
// them under one errgroup and shuts them down in order when its context ends.
//
// In dev mode (config.ModeDev) the parts that a cluster would provide are
// replaced by embedded ones, each only where the config leaves it unset: an
// embedded Redis (miniredis), an in-process OIDC issuer with a dev user, a
// simulated cluster (spawner/devcluster) and the GPUs of a simulated DGX
// H200 (go-nvml's mock/dgxh200). Every simulated part is named in the log
// and in the API's answers.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/spawner"
)

// HTTP server timeouts. Bodies are at most 1 MiB, so reads are short; the
// event stream extends its own write deadline per event, so WriteTimeout
// only bounds ordinary answers.
const (
	readHeaderTimeout = 10 * time.Second  // slow-header clients
	readTimeout       = 30 * time.Second  // whole request, body included
	writeTimeout      = 60 * time.Second  // ordinary answers; SSE extends per write
	idleTimeout       = 120 * time.Second // keep-alive between requests
	// eventsBlock is how long an event stream waits in Redis before a
	// keepalive. A blocked read does not see its request end, so this also
	// bounds how long an open stream can hold up shutdown.
	eventsBlock = 3 * time.Second
)

// Version is the module version the binary was built from, or "devel".
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// CheckConfig loads the files a config names (profiles, hub token,
// kubeconfig or the in-cluster service account), reporting every problem at
// once, without contacting anything; it is what --check-config adds to
// Validate.
func CheckConfig(cfg config.Config) error {
	var errs []error
	if cfg.ProfilesFile != "" {
		if _, err := catalog.Load(cfg.ProfilesFile); err != nil {
			errs = append(errs, err) // catalog names the file in each problem
		}
	}
	if _, err := cfg.HubToken(); err != nil {
		errs = append(errs, err)
	}
	if cfg.Mode == config.ModeServe || cfg.Kubeconfig != "" {
		// Builds the client config only; nothing is contacted.
		if _, err := kubeClient(cfg.Kubeconfig); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// parts are the built components that Run starts.
type parts struct {
	log        *slog.Logger
	redis      redis.UniversalClient
	store      *redisstore.Store
	agents     *agentstore.Store
	kube       kubernetes.Interface
	spawner    *spawner.Client
	service    *servers.Service
	reconciler *reconcile.Reconciler
	reclaimer  *reclaim.Reclaimer
	handler    http.Handler
	// background runs simulated or embedded parts (dev mode); nil in serve.
	background []func(ctx context.Context) error
	// started, if set, runs once the first reconcile pass is done.
	started func()
	// checkers are the readiness checks (/readyz), also logged shortly
	// after start so a broker whose dependencies are down says so.
	checkers []httpapi.Checker
	// closers run after everything has stopped, in reverse order.
	closers []func()
}

func (p *parts) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// Run runs the broker until ctx ends, then shuts down gracefully within
// cfg.ShutdownTimeout. stdout receives dev mode's banner; logs go to stderr.
func Run(ctx context.Context, cfg config.Config, stdout, stderr io.Writer) error {
	log := cfg.Logger(stderr)
	klog.SetSlogLogger(log)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	var p *parts
	if cfg.Mode == config.ModeDev {
		p, err = buildDev(ctx, cfg, log, ln, stdout)
	} else {
		p, err = buildServe(ctx, cfg, log)
	}
	if err != nil {
		ln.Close()
		return err
	}
	defer p.close()

	g, gctx := errgroup.WithContext(ctx)
	for _, run := range p.background {
		g.Go(func() error { return ignoreCanceled(run(gctx)) })
	}
	g.Go(func() error { return ignoreCanceled(p.spawner.Run(gctx)) })
	g.Go(func() error { return forwardPodEvents(gctx, p) })
	g.Go(func() error { return syncInventory(gctx, p.agents, p.store, log, inventoryInterval) })
	g.Go(func() error {
		if err := p.spawner.WaitSynced(gctx); err != nil {
			return ignoreCanceled(err)
		}
		// The first pass rebuilds allocations before anyone is told the
		// broker is up; placement waits for it anyway (fleet.ErrNotReady).
		if _, err := p.reconciler.Once(gctx); err != nil {
			log.Warn("first reconcile pass failed; retrying on schedule", "err", err)
		}
		if p.started != nil {
			p.started()
		}
		return ignoreCanceled(p.reconciler.Run(gctx))
	})
	g.Go(func() error { return ignoreCanceled(runReclaimer(gctx, cfg, p)) })
	g.Go(func() error { return serveHTTP(gctx, cfg, log, ln, p.handler) })
	g.Go(func() error { return warnIfNotReady(gctx, log, p.checkers, startupCheckDelay) })
	log.Info("gpubroker started", "listen", ln.Addr().String(), "mode", string(cfg.Mode), "version", Version())
	err = g.Wait()
	log.Info("gpubroker stopped")
	return err
}

// startupCheckDelay is how long after start the readiness checks are run
// once and their failures logged: long enough for a healthy broker's caches
// to sync, short enough that a misconfigured one says so at once.
const startupCheckDelay = 10 * time.Second

// warnIfNotReady runs the readiness checks once, after delay, and logs each
// failing one as a warning (the same checks answer /readyz).
func warnIfNotReady(ctx context.Context, log *slog.Logger, checks []httpapi.Checker, delay time.Duration) error {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-t.C:
	}
	for _, c := range checks {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.Check(cctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "not ready: a dependency does not answer; /readyz reports the same", "check", c.Name(), "err", err)
		}
	}
	return nil
}

// forwardPodEvents hands every pod observation to the lifecycle. The
// spawner's dispatcher must not block, so events pass through a buffer; if
// it overflows, the reconciler is asked for a pass, which replays every
// pod's current phase. A storage failure is logged and left to that pass too.
func forwardPodEvents(ctx context.Context, p *parts) error {
	events := make(chan spawner.PodEvent, 1024)
	p.spawner.Subscribe(ctx, func(ev spawner.PodEvent) {
		select {
		case events <- ev:
		default:
			p.reconciler.Trigger()
		}
	})
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-events:
			if err := p.service.HandlePodEvent(ctx, ev); err != nil && ctx.Err() == nil {
				p.log.WarnContext(ctx, "pod event not applied; the reconciler will retry", "pod", ev.Pod, "err", err)
			}
		}
	}
}

// serveHTTP serves until ctx ends, then drains within the shutdown timeout.
// Request contexts are cancelled when shutdown begins, so event streams end.
func serveHTTP(ctx context.Context, cfg config.Config, log *slog.Logger, ln net.Listener, h http.Handler) error {
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	cancelBase()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown did not drain in time", "err", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// buildServe wires the parts against a real Redis and cluster.
func buildServe(ctx context.Context, cfg config.Config, log *slog.Logger) (*parts, error) {
	cat, err := catalog.Load(cfg.ProfilesFile)
	if err != nil {
		return nil, fmt.Errorf("profiles file %s: %w", cfg.ProfilesFile, err)
	}
	ropts, err := cfg.RedisOptions()
	if err != nil {
		return nil, err
	}
	rdb := redis.NewUniversalClient(ropts)
	kube, err := kubeClient(cfg.Kubeconfig)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	bearer, err := auth.NewBearer(ctx, auth.BearerConfig{
		IssuerURL: cfg.OIDCIssuer, Audience: cfg.OIDCAudience,
		UsernameClaim: cfg.OIDCUsernameClaim, GroupsClaim: cfg.OIDCGroupsClaim, AdminGroup: cfg.AdminGroup,
	})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	hub, err := cfg.HubToken()
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ws, err := serveWebSettings(cfg, log)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	p, err := assemble(cfg, log, rdb, kube, cat, bearer, auth.NewHubToken(hub.Reveal()), httpapi.Mode{}, ws)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	p.closers = append(p.closers, func() { rdb.Close() })
	return p, nil
}

// kubeClient builds a clientset from a kubeconfig file, or from the pod's
// service account when path is empty.
func kubeClient(path string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if path == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "gpubroker/" + Version()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}

// assemble builds the parts every mode shares. Callers of the API are
// authenticated by the hub token first (when one is set), then by bearer,
// then (with ws) by the web login's session cookie. With ws the handler
// also serves the web login (/auth/) and the pages (everything outside
// /api/ and the probes).
func assemble(cfg config.Config, log *slog.Logger, rdb redis.UniversalClient, kube kubernetes.Interface,
	cat *catalog.Catalog, bearer *auth.Bearer, hub *auth.HubToken, mode httpapi.Mode, ws *webSettings) (*parts, error) {
	rdb.AddHook(redisstore.OutageHook{}) // an unreachable Redis is a 503 naming it, never a 500
	store := redisstore.New(rdb, cfg.RedisPrefix)
	sp := spawner.New(kube, spawner.Config{
		Namespace: cfg.Namespace, HostRoot: cfg.HostRoot, Exposure: spawner.Exposure(cfg.GPUExposure),
		RuntimeClassName: cfg.RuntimeClass, StartTimeout: cfg.StartTimeout,
	}.WithDefaults(), log.With("part", "spawner"))
	p := &parts{log: log, redis: rdb, store: store, kube: kube, spawner: sp,
		agents: agentstore.New(rdb, cfg.RedisPrefix)}
	var rec *reconcile.Reconciler
	audit := redisstore.NewAuditLog(rdb, cfg.RedisPrefix, p.agents)
	p.service = servers.New(store, sp, cat, log.With("part", "servers"),
		servers.WithAudit(audit),
		servers.WithPolicy(fleet.Policy(cfg.PlacementPolicy)),
		servers.WithReconcileTrigger(func() { rec.Trigger() }),
		servers.WithResize(servers.ResizeConfig{Store: store, Quotas: p.agents, Pods: sp}))
	rec = reconcile.New(store, sp, p.service, log.With("part", "reconcile"), cfg.OrphanGrace, cfg.ReconcileInterval, nil)
	p.reconciler = rec
	policies := reclaim.NewPolicies(redisstore.NewReclaim(rdb, cfg.RedisPrefix), nil)
	var err error
	if p.reclaimer, err = newReclaimer(cfg, log.With("part", "reclaim"), p, policies, audit); err != nil {
		return nil, err
	}
	authn := []auth.Authenticator{hub, bearer}
	var web *auth.Web
	proxy := &pagesProxy{}
	if ws != nil {
		if web, err = newWebLogin(cfg, ws, rdb, log, proxy); err != nil {
			return nil, err
		}
		authn = append(authn, web)
	}
	p.checkers = []httpapi.Checker{
		checker{"redis", store.Ping},
		checker{"kubernetes", func(ctx context.Context) error { return kubeReady(ctx, kube, cfg.Namespace, sp) }},
		checker{"oidc", bearer.Ready},
	}
	h, err := httpapi.New(httpapi.Deps{
		Log: log, Servers: p.service, Resize: p.service, Profiles: cat, Fleet: store,
		Policy: policies, Audit: audit, Reclaim: p.reclaimer,
		Auth: auth.Chain(authn...), Version: Version(), Mode: mode,
		Checkers: p.checkers,
	}, httpapi.WithEventsBlock(eventsBlock))
	if err != nil {
		return nil, fmt.Errorf("http api: %w", err)
	}
	p.handler = h
	if web != nil {
		if p.handler, err = mountPages(h, web, proxy, agentUsage{agents: p.agents}, log, mode.Notice); err != nil {
			return nil, err
		}
		log.Info("web pages on", "public_url", ws.publicURL, "issuer", redirectHost(ws.issuerURL))
	}
	return p, nil
}

// checker adapts a function to httpapi.Checker.
type checker struct {
	name  string
	check func(context.Context) error
}

func (c checker) Name() string                    { return c.name }
func (c checker) Check(ctx context.Context) error { return c.check(ctx) }

// kubeReady reports whether the API server answers (a one-item list in the
// broker's own namespace, which its RBAC allows) and the pod cache is synced.
func kubeReady(ctx context.Context, kube kubernetes.Interface, namespace string, sp *spawner.Client) error {
	if !sp.Synced() {
		return errors.New("pod cache is not synced yet")
	}
	if _, err := kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("api server: %w", err)
	}
	return nil
}
