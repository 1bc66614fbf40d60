// Package app is the broker's composition root: the only package that sees
// every concrete type. Serve builds the outside parts (Infra: Redis, the
// Kubernetes client, the profiles, the OIDC verifier) from a validated serve
// config; Run builds the broker's own parts over an Infra, runs them under
// one errgroup and shuts them down in order when its context ends.
//
// Nothing here simulates anything: the production binary (gpubroker serve)
// links no embedded Redis, fake clientset, NVML mock or token minting. Dev
// mode is its own composition root, broker/internal/app/dev, built into its
// own binary (gpubroker-dev): it makes an Infra of embedded and simulated
// parts and hands it to Run.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
	"github.com/gpubroker/gpubroker/broker/internal/proxy"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
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

// CheckConfig loads the files a config names (profiles, hub token,
// kubeconfig or, in serve mode, the in-cluster service account), reporting
// every problem at once, without contacting anything; it is what
// --check-config adds to Validate.
func CheckConfig(cfg config.Config) error {
	// A file that is not there is one problem, which Validate reports;
	// only files that are there are read here.
	there := func(path string) bool { return path != "" && cliconfig.CheckFile(path) == nil }
	var errs []error
	if there(cfg.ProfilesFile) {
		// One line per problem of the file, each naming the flag and file.
		flag := "--profiles-file (" + config.EnvName("profiles-file") + ") " + cfg.ProfilesFile
		if data, err := os.ReadFile(cfg.ProfilesFile); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flag, err))
		} else if _, err := catalog.Parse(data); err != nil {
			for _, e := range cliconfig.Split(err) {
				errs = append(errs, fmt.Errorf("%s: %w", flag, e))
			}
		}
	}
	if there(cfg.HubTokenFile) {
		if _, err := cfg.HubToken(); err != nil {
			errs = append(errs, fmt.Errorf("--hub-token-file (%s): %w", config.EnvName("hub-token-file"), err))
		}
	}
	if (cfg.Mode == config.ModeServe && cfg.Kube.Kubeconfig == "") || there(cfg.Kube.Kubeconfig) {
		// Builds the client config only; nothing is contacted.
		if _, err := KubeClient(cfg.Kube); err != nil {
			errs = append(errs, fmt.Errorf("--kubeconfig (%s): %w", config.EnvName("kubeconfig"), err))
		}
	}
	return errors.Join(errs...)
}

// Infra are the outside parts the broker runs on. Serve builds them from
// the configuration; gpubroker-dev embeds or simulates some of them. Run
// takes them over: it calls Closers when it returns, even on error.
type Infra struct {
	// Redis is the broker's Redis; Kube its Kubernetes client.
	Redis redis.UniversalClient
	Kube  kubernetes.Interface
	// Streams is a client of the same Redis for the event streams' blocking
	// reads, with a pool of its own so that waiting streams never take the
	// connections placement needs; nil means Redis.
	Streams redis.UniversalClient
	// Catalog is the profiles and quotas.
	Catalog *catalog.Catalog
	// Bearer verifies API tokens; Hub the JupyterHub service token.
	Bearer *auth.Bearer
	Hub    *auth.HubToken
	// Mode marks the API's answers (dev mode's simulation notice).
	Mode httpapi.Mode
	// Web turns the web login and pages on; nil leaves them off.
	Web *WebSettings
	// Background runs embedded parts next to the broker until ctx ends.
	Background []func(ctx context.Context) error
	// Started, if set, runs once the first reconcile pass is done.
	Started func()
	// Metrics is the instrumentation, served on --metrics-listen; nil:
	// Run makes one (NewMetrics). Serve makes it first, so that its
	// Kubernetes client counts its errors.
	Metrics *Metrics
	// Closers run after everything has stopped, in reverse order.
	Closers []func()
}

// close runs the closers in reverse order.
func (in Infra) close() {
	for i := len(in.Closers) - 1; i >= 0; i-- {
		in.Closers[i]()
	}
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
	metrics    *Metrics
	// notebooks is the notebook proxy; nil while the web pages are off.
	notebooks *proxy.Proxy
	handler   http.Handler
	// drain is closed when the HTTP server starts its graceful shutdown:
	// the event streams end then (httpapi.WithDrain).
	drain chan struct{}
	// checkers are the readiness checks (/readyz), also logged shortly
	// after start so a broker whose dependencies are down says so.
	checkers []httpapi.Checker
	// leading is whether this replica applies pod events
	// (forwardPodEvents): while it holds the Lease (runReclaimer), or
	// always when no Lease is configured.
	leading atomic.Bool
}

// Serve runs gpubroker serve: it builds the Infra from cfg (a validated
// serve config) and runs the broker on cfg.Listen until ctx ends. Logs go
// to stderr.
func Serve(ctx context.Context, cfg config.Config, stderr io.Writer) error {
	log := cfg.Logger(stderr)
	klog.SetSlogLogger(log)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	infra, err := buildServe(ctx, cfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	return Run(ctx, cfg, log, ln, infra)
}

// Run runs the broker on ln over infra until ctx ends, then shuts down
// gracefully within cfg.ShutdownTimeout. It owns ln and infra: both are
// closed when it returns.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, ln net.Listener, infra Infra) error {
	defer infra.close()
	if infra.Metrics == nil {
		m, err := NewMetrics(cfg, infra.Catalog)
		if err != nil {
			ln.Close()
			return err
		}
		infra.Metrics = m
	}
	infra.Redis.AddHook(infra.Metrics.RedisHook())
	infra.Metrics.CollectRedisPool("main", infra.Redis)
	if infra.Streams != nil {
		infra.Streams.AddHook(infra.Metrics.RedisHook())
		infra.Metrics.CollectRedisPool("streams", infra.Streams)
	}
	p, err := assemble(cfg, log, infra)
	if err != nil {
		ln.Close()
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	for _, run := range infra.Background {
		g.Go(func() error { return ignoreCanceled(run(gctx)) })
	}
	g.Go(func() error { return ignoreCanceled(p.spawner.Run(gctx)) })
	g.Go(func() error { return forwardPodEvents(gctx, p) })
	g.Go(func() error { return syncInventory(gctx, p.agents, p.store, log, inventoryInterval) })
	g.Go(func() error { return followEnforcement(gctx, p) })
	g.Go(func() error {
		if err := p.spawner.WaitSynced(gctx); err != nil {
			return ignoreCanceled(err)
		}
		// The first pass rebuilds allocations before anyone is told the
		// broker is up; placement waits for it anyway (fleet.ErrNotReady).
		if _, err := p.reconciler.Once(gctx); err != nil {
			log.Warn("first reconcile pass failed; retrying on schedule", "err", err)
		}
		if infra.Started != nil {
			infra.Started()
		}
		return ignoreCanceled(p.reconciler.Run(gctx))
	})
	g.Go(func() error { return ignoreCanceled(runReclaimer(gctx, cfg, p)) })
	if p.notebooks != nil {
		g.Go(func() error { return ignoreCanceled(p.notebooks.Run(gctx)) })
	}
	g.Go(func() error { return serveHTTP(gctx, cfg, log, ln, p.handler, p.drain) })
	g.Go(func() error {
		return watchReadiness(gctx, log, p.checkers, p.metrics.Broker, startupCheckDelay, readinessInterval)
	})
	g.Go(func() error {
		return recordFleet(gctx, p.store, p.agents, p.metrics.Broker, log, min(cfg.ReconcileInterval, fleetInterval))
	})
	g.Go(func() error {
		return serveMetrics(gctx, cfg.MetricsListen, p.metrics.Registry, log, cfg.ShutdownTimeout)
	})
	g.Go(func() error {
		return servePprof(gctx, cfg.DebugPprofListen, log, cfg.ShutdownTimeout)
	})
	log.Info("gpubroker started", "listen", ln.Addr().String(), "mode", string(cfg.Mode), "version", cliconfig.Version())
	err = g.Wait()
	log.Info("gpubroker stopped")
	return err
}

// followEnforcement tells servers what the node agents did to their
// processes (audit records, shared between the replicas by a Redis consumer
// group; this replica's name in it is its host name, the pod's name).
func followEnforcement(ctx context.Context, p *parts) error {
	id, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("enforcement follower identity: %w", err)
	}
	return p.service.FollowEnforcement(ctx, p.agents, id)
}

// startupCheckDelay is how long after start failing readiness checks are
// first logged: long enough for a healthy broker's caches to sync, short
// enough that a misconfigured one says so at once.
const startupCheckDelay = 10 * time.Second

// serveHTTP serves until ctx ends, then shuts down gracefully: it stops
// accepting connections, then closes drain (the handler's event streams
// end) and waits up to the shutdown timeout for the requests in flight to
// finish; those still running then have their contexts cancelled.
func serveHTTP(ctx context.Context, cfg config.Config, log *slog.Logger, ln net.Listener, h http.Handler, drain chan struct{}) error {
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	srv := newServer(h, log)
	srv.BaseContext = func(net.Listener) context.Context { return base }
	srv.RegisterOnShutdown(func() { close(drain) }) // run once the listener is closed
	return serveUntil(ctx, "http server", srv, ln, cfg.ShutdownTimeout, log)
}

// newServer returns an http.Server for h with the broker's timeouts,
// logging its errors to log as warnings.
func newServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serveUntil serves srv on ln until ctx ends, then shuts srv down, waiting
// up to timeout for its requests to finish; name names the server in
// errors and in the warning logged when they did not. A Serve failure
// before ctx ends is returned.
func serveUntil(ctx context.Context, name string, srv *http.Server, ln net.Listener, timeout time.Duration, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: %w", name, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn(name+" shutdown did not drain in time", "err", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// buildServe builds the outside parts of a serve config: a real Redis,
// cluster and OIDC issuer, the profiles file, the web login's settings.
func buildServe(ctx context.Context, cfg config.Config, log *slog.Logger) (Infra, error) {
	cat, err := catalog.Load(cfg.ProfilesFile)
	if err != nil {
		return Infra{}, fmt.Errorf("profiles file %s: %w", cfg.ProfilesFile, err)
	}
	rdb, streams, err := RedisClients(cfg)
	if err != nil {
		return Infra{}, err
	}
	in := Infra{Redis: rdb, Streams: streams, Catalog: cat, Closers: []func(){func() { rdb.Close() }, func() { streams.Close() }}}
	fail := func(err error) (Infra, error) {
		in.close()
		return Infra{}, err
	}
	if in.Metrics, err = NewMetrics(cfg, cat); err != nil {
		return fail(err)
	}
	rc, err := cfg.Kube.RESTConfig(userAgent())
	if err != nil {
		return fail(err)
	}
	rc.Wrap(in.Metrics.KubeTransport)
	if in.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return fail(fmt.Errorf("kubernetes client: %w", err))
	}
	if in.Bearer, err = NewBearer(ctx, cfg, cfg.OIDCIssuer, cfg.OIDCAudience); err != nil {
		return fail(err)
	}
	hub, err := cfg.HubToken()
	if err != nil {
		return fail(err)
	}
	in.Hub = auth.NewHubToken(hub.Reveal())
	if in.Web, err = serveWebSettings(cfg, log); err != nil {
		return fail(err)
	}
	return in, nil
}

// RedisClients returns two clients of the configured Redis: rdb for every
// operation and streams, with a pool of cfg.RedisStreamConnections, for the
// event streams' blocking reads (Infra.Streams). The caller closes both.
func RedisClients(cfg config.Config) (rdb, streams redis.UniversalClient, err error) {
	opts, err := cfg.Redis.Options()
	if err != nil {
		return nil, nil, err
	}
	streamOpts := *opts
	streamOpts.PoolSize = cfg.RedisStreamConnections
	return redis.NewUniversalClient(opts), redis.NewUniversalClient(&streamOpts), nil
}

// NewBearer builds the API token verifier for issuer and audience with the
// claims cfg names.
func NewBearer(ctx context.Context, cfg config.Config, issuer, audience string) (*auth.Bearer, error) {
	return auth.NewBearer(ctx, auth.BearerConfig{
		IssuerURL: issuer, Audience: audience,
		UsernameClaim: cfg.OIDCUsernameClaim, GroupsClaim: cfg.OIDCGroupsClaim, AdminGroup: cfg.AdminGroup,
	})
}

// KubeClient builds the broker's clientset from its Kubernetes settings; it
// contacts nothing.
func KubeClient(k cliconfig.Kube) (kubernetes.Interface, error) {
	return k.Clientset(userAgent())
}

// userAgent is the broker's user agent at the API server.
func userAgent() string { return "gpubroker/" + cliconfig.Version() }

// assemble builds the broker's parts over infra. Callers of the API are
// authenticated by the hub token first (when one is set), then by bearer,
// then (with infra.Web) by the web login's session cookie. With infra.Web
// the handler also serves the web login (/auth/) and the pages (everything
// outside /api/ and the probes).
func assemble(cfg config.Config, log *slog.Logger, infra Infra) (*parts, error) {
	rdb, kube, cat, mode, ws := infra.Redis, infra.Kube, infra.Catalog, infra.Mode, infra.Web
	// An unreachable Redis is a 503 naming it, never a 500.
	rdb.AddHook(redisstore.OutageHook{})
	if infra.Streams != nil && infra.Streams != rdb {
		infra.Streams.AddHook(redisstore.OutageHook{})
	}
	store := redisstore.New(rdb, cfg.Redis.Prefix, redisstore.WithBlockingClient(infra.Streams),
		redisstore.WithWaitReplicas(cfg.WaitReplicas(), cfg.RedisWaitTimeout))
	sp := spawner.New(kube, spawner.Config{
		Namespace: cfg.Namespace, HostRoot: cfg.HostRoot, Exposure: spawner.Exposure(cfg.GPUExposure),
		RuntimeClassName: cfg.RuntimeClass, StartTimeout: cfg.StartTimeout,
	}.WithDefaults(), log.With("part", "spawner"), spawner.WithResync(cfg.PodResync))
	m := infra.Metrics
	p := &parts{log: log, redis: rdb, store: store, kube: kube, spawner: sp, metrics: m,
		agents: agentstore.New(rdb, cfg.Redis.Prefix), drain: make(chan struct{})}
	var rec *reconcile.Reconciler
	audit := redisstore.NewAuditLog(rdb, cfg.Redis.Prefix, p.agents)
	p.service = servers.New(store, sp, cat, log.With("part", "servers"),
		servers.WithAudit(audit),
		servers.WithPolicy(fleet.Policy(cfg.PlacementPolicy)),
		servers.WithReconcileTrigger(func() { rec.Trigger() }),
		servers.WithResize(servers.ResizeConfig{Store: store, Quotas: p.agents, Pods: sp}),
		servers.WithMetrics(m))
	rec = reconcile.New(store, sp, p.service, log.With("part", "reconcile"), cfg.OrphanGrace, cfg.ReconcileInterval, nil)
	rec.SetMetrics(m)
	if cfg.LeaderElectionNamespace != "" {
		rec.SetLeading(false) // until this replica holds the Lease (runReclaimer)
	} else {
		p.leading.Store(true) // the only replica
	}
	p.reconciler = rec
	policies := reclaim.NewPolicies(redisstore.NewReclaim(rdb, cfg.Redis.Prefix), nil, log.With("part", "reclaim"))
	var err error
	if p.reclaimer, err = newReclaimer(cfg, log.With("part", "reclaim"), p, policies, audit); err != nil {
		return nil, err
	}
	authn := []auth.Authenticator{infra.Hub, infra.Bearer}
	var web *auth.Web
	pages := &pagesProxy{}
	var openURL func(user, name string) string
	if ws != nil {
		if web, err = newWebLogin(cfg, ws, rdb, log, pages); err != nil {
			return nil, err
		}
		authn = append(authn, web)
		if p.notebooks, err = newNotebookProxy(cfg, ws, log, p, web, infra.Bearer, pages); err != nil {
			return nil, err
		}
		openURL = p.notebooks.OpenURL
	}
	p.checkers = []httpapi.Checker{
		checker{"redis", store.Ping},
		checker{"kubernetes", func(ctx context.Context) error { return kubeReady(ctx, kube, cfg.Namespace, sp) }},
		checker{"oidc", infra.Bearer.Ready},
	}
	h, err := httpapi.New(httpapi.Deps{
		Log: log, Servers: p.service, Resize: p.service, Profiles: cat, Fleet: store,
		Policy: policies, Audit: audit, Reclaim: p.reclaimer, Guarantees: agentGuarantees{agents: p.agents},
		Auth: auth.Chain(authn...), Version: cliconfig.Version(), Mode: mode,
		Checkers: p.checkers, Metrics: m, OpenURL: openURL,
	}, httpapi.WithEventsBlock(eventsBlock), httpapi.WithDrain(p.drain))
	if err != nil {
		return nil, fmt.Errorf("http api: %w", err)
	}
	p.handler = h
	if web != nil {
		if p.handler, err = mountPages(h, web, pages, agentUsage{agents: p.agents}, log, mode.Notice); err != nil {
			return nil, err
		}
		p.handler = p.notebooks.Handler(p.handler)
		log.Info("web pages and notebook proxy on", "public_url", ws.PublicURL, "issuer", redirectHost(ws.IssuerURL),
			"notebook_mode", cfg.NotebookMode, "notebook_domain", cfg.NotebookDomain)
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

// Dependencies are the outside parts --connect contacts: Redis (PING), the
// OIDC issuer (discovery and its keys) and the Kubernetes API server (one
// pod listed in the notebooks' namespace, which the broker's RBAC allows).
// embedded names the ones dev mode embeds instead ("redis", "oidc",
// "kubernetes"), which are listed without a check.
func Dependencies(cfg config.Config, embedded ...string) []cliconfig.Dependency {
	deps := []cliconfig.Dependency{
		cfg.Redis.Dependency(),
		{Name: "oidc", Where: cfg.OIDCIssuer, Check: func(ctx context.Context) error {
			b, err := NewBearer(ctx, cfg, cfg.OIDCIssuer, cfg.OIDCAudience)
			if err != nil {
				return err
			}
			return b.Ready(ctx)
		}},
		{Name: "kubernetes", Where: cfg.Kube.Where() + ", namespace " + cfg.Namespace, Check: func(ctx context.Context) error {
			kube, err := KubeClient(cfg.Kube)
			if err != nil {
				return err
			}
			if _, err := kube.CoreV1().Pods(cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return fmt.Errorf("list pods: %w", err)
			}
			return nil
		}},
	}
	for i := range deps {
		if slices.Contains(embedded, deps[i].Name) {
			deps[i].Where, deps[i].Check = "embedded", nil
		}
	}
	return deps
}
