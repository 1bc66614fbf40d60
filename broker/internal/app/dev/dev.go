package dev

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"

	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/internal/app"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/spawner/devcluster"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

// Dev mode's fixed names.
const (
	devUser     = "dev"
	devGuest    = "alice"
	devNode     = "dgx-h200-sim"
	devTokenTTL = 24 * time.Hour
)

// Run runs gpubroker-dev until ctx ends: it embeds whatever c leaves unset,
// registers the simulated GPUs, runs the broker (app.Run) and, once it is
// up, prints the banner with ready-to-paste commands to stdout. Logs go to
// stderr.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) error {
	cfg := c.Broker
	log := cfg.Logger(stderr)
	klog.SetSlogLogger(log)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	infra, err := build(ctx, c, log, ln, stdout)
	if err != nil {
		ln.Close()
		return err
	}
	return app.Run(ctx, cfg, log, ln, infra)
}

// build makes the Infra of gpubroker-dev, embedding whatever c leaves
// unset; on error everything it started is closed again.
func build(ctx context.Context, c Config, log *slog.Logger, ln net.Listener, stdout io.Writer) (app.Infra, error) {
	cfg := c.Broker
	var in app.Infra
	var simulated []string
	fail := func(err error) (app.Infra, error) {
		for i := len(in.Closers) - 1; i >= 0; i-- {
			in.Closers[i]()
		}
		return app.Infra{}, err
	}

	in.Catalog = catalog.Default()
	if cfg.ProfilesFile != "" {
		cat, err := catalog.Load(cfg.ProfilesFile)
		if err != nil {
			return fail(fmt.Errorf("profiles file %s: %w", cfg.ProfilesFile, err))
		}
		in.Catalog = cat
	}

	if cfg.Redis.URL == "" && cfg.Redis.SentinelMaster == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return fail(fmt.Errorf("embedded redis: %w", err))
		}
		in.Closers = append(in.Closers, mr.Close)
		in.Redis = redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		in.Streams = redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, PoolSize: cfg.RedisStreamConnections})
		simulated = append(simulated, "Redis is embedded (miniredis, in memory: data is lost at exit)")
	} else {
		var err error
		if in.Redis, in.Streams, err = app.RedisClients(cfg); err != nil {
			return fail(err)
		}
	}
	rdb, streams := in.Redis, in.Streams
	in.Closers = append(in.Closers, func() { rdb.Close() }, func() { streams.Close() })

	issuerURL, audience := cfg.OIDCIssuer, cfg.OIDCAudience
	publicURL := devPublicURL(cfg.PublicURL, ln)
	var token string
	if issuerURL == "" {
		il, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(fmt.Errorf("embedded oidc issuer: %w", err))
		}
		issuerURL = "http://" + il.Addr().String()
		if audience == "" {
			audience = devissuer.DefaultAudience
		}
		// The web login: the dev user signs in with one click (no form);
		// /auth/login?login_hint=alice signs in a non-admin instead.
		secret := rand.Text()
		iss, err := devissuer.New(devissuer.WithURL(issuerURL),
			devissuer.WithUsers(
				devissuer.User{Subject: devUser, Username: devUser, Email: devUser + "@localhost", Groups: []string{cfg.AdminGroup, "developers"}},
				devissuer.User{Subject: devGuest, Username: devGuest, Email: devGuest + "@localhost", Groups: []string{"developers"}}),
			devissuer.WithAutoApprove(devUser),
			devissuer.WithClient(devissuer.Client{ID: audience, Secret: secret,
				RedirectURIs:           []string{publicURL + auth.CallbackPath},
				PostLogoutRedirectURIs: []string{publicURL + auth.SignedOutPath}}))
		if err != nil {
			il.Close()
			return fail(fmt.Errorf("embedded oidc issuer: %w", err))
		}
		in.Background = append(in.Background, func(ctx context.Context) error { return iss.Serve(ctx, il) })
		in.Closers = append(in.Closers, func() { il.Close() }) // Serve closes it too; this covers a Run that never started
		in.Web = &app.WebSettings{IssuerURL: issuerURL, ClientID: audience, ClientSecret: secret, PublicURL: publicURL}
		token, err = iss.Mint(devissuer.Claims{
			Subject: devUser, Username: devUser, Email: devUser + "@localhost",
			Groups: []string{cfg.AdminGroup, "developers"}, Audience: audience, ExpiresIn: devTokenTTL,
		})
		if err != nil {
			return fail(fmt.Errorf("mint dev token: %w", err))
		}
		simulated = append(simulated, "the OIDC issuer is embedded at "+issuerURL+" with two users, "+devUser+" (an admin, signed in with one click) and "+devGuest)
	} else if cfg.PublicURL != "" {
		secret, err := cfg.ClientSecret()
		if err != nil {
			return fail(err)
		}
		in.Web = &app.WebSettings{IssuerURL: issuerURL, ClientID: cfg.ClientID(), ClientSecret: secret.Reveal(), PublicURL: publicURL}
	}
	bearer, err := app.NewBearer(ctx, cfg, issuerURL, audience)
	if err != nil {
		return fail(err)
	}
	hub, err := cfg.HubToken()
	if err != nil {
		return fail(err)
	}
	in.Bearer, in.Hub = bearer, auth.NewHubToken(hub.Reveal())

	// The node's filesystem: the pods' host paths and the node agent's
	// slice files are under it.
	nodeRoot, err := os.MkdirTemp("", "gpubroker-dev-node-")
	if err != nil {
		return fail(fmt.Errorf("dev node: %w", err))
	}
	in.Closers = append(in.Closers, func() { _ = os.RemoveAll(nodeRoot) })
	if cfg.Kube.Kubeconfig == "" {
		cl := devcluster.New([]string{devNode}, log.With("part", "devcluster"), devcluster.WithNamespace(cfg.Namespace))
		in.Kube = cl.Clientset()
		var nb *runner.Runner
		why := "--dev-notebooks=simulated"
		if c.Notebooks != "simulated" {
			var cleanup func()
			if nb, cleanup, why, err = localNotebooks(ctx, log, in.Kube, cfg.Namespace, nodeRoot, cfg.HostRoot, in.Catalog.Profiles()); err != nil {
				return fail(err)
			}
			if cleanup != nil {
				in.Closers = append(in.Closers, cleanup)
			}
		}
		if nb != nil {
			in.Background = append(in.Background, nb.Run)
			simulated = append(simulated, "the Kubernetes cluster is simulated: one node, "+devNode+", whose notebook pods run as real Jupyter servers on this machine (without a GPU)")
		} else {
			in.Background = append(in.Background, cl.Run)
			simulated = append(simulated, "the Kubernetes cluster is simulated: one node, "+devNode+"; pods do not really run ("+why+")")
		}
	} else if in.Kube, err = app.KubeClient(cfg.Kube); err != nil {
		return fail(err)
	}

	simulated = append(simulated, fmt.Sprintf("the GPUs are simulated (%d× idle NVIDIA H200 from go-nvml's mock/dgxh200) on node %s, "+
		"where the real node agent applies resizes and samples use (it reports bypasses, never kills)", c.GPUs, devNode))
	in.Mode = httpapi.Mode{Simulated: true, Notice: "LOCAL DEV MODE: " + strings.Join(simulated, "; ") + "."}
	lib := simulatedNVML(c.GPUs)
	if err := registerSimulatedGPUs(ctx, redisstore.New(rdb, cfg.Redis.Prefix), devNode, lib); err != nil {
		return fail(err)
	}
	runAgent, err := nodeAgent(in.Kube, cfg.Namespace, rdb, cfg.Redis.Prefix, nodeRoot, cfg.HostRoot, lib, log)
	if err != nil {
		return fail(err)
	}
	in.Background = append(in.Background, runAgent)
	for _, s := range simulated {
		log.Warn("dev mode: " + s)
	}
	web := ""
	if in.Web != nil {
		web = in.Web.PublicURL
	}
	profiles := in.Catalog.Profiles()
	hubTokenFile := ""
	if hub.Reveal() != "" {
		hubTokenFile = cfg.HubTokenFile
	}
	in.Started = func() { printBanner(stdout, listenURL(ln), web, token, hubTokenFile, profiles) }
	return in, nil
}

// devPublicURL is dev mode's public URL: the configured one, else the
// listener's URL.
func devPublicURL(configured string, ln net.Listener) string {
	if configured != "" {
		return configured
	}
	return listenURL(ln)
}

// listenURL is the http URL a person on this machine opens for ln:
// "localhost" for an unspecified host (":8080" listens on [::]), the host
// as it is otherwise.
func listenURL(ln net.Listener) string {
	host, port, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		return "http://" + ln.Addr().String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// registerSimulatedGPUs registers the GPUs of lib for placement,
// discovered through the same code the node agent uses, so that they are
// placeable before the agent's first heartbeat.
func registerSimulatedGPUs(ctx context.Context, store *redisstore.Store, node string, lib nvml.Interface) error {
	gpus, err := agent.Discover(lib, node)
	if err != nil {
		return fmt.Errorf("simulated gpus: %w", err)
	}
	for _, g := range gpus {
		if err := store.RegisterGPU(ctx, fleet.GPU{UUID: g.UUID, Node: g.Node, Model: g.Model,
			MemoryMiB: g.MemoryMiB, SMCount: g.SMCount, Healthy: g.Healthy}); err != nil {
			return fmt.Errorf("register simulated gpu %s: %w", g.UUID, err)
		}
	}
	return nil
}

// printBanner tells a newcomer what runs and gives commands to paste.
func printBanner(w io.Writer, base, web, token, hubTokenFile string, profiles []fleet.Profile) {
	profile := "small"
	if len(profiles) > 0 {
		profile = profiles[0].Name
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\ngpubroker-dev — LOCAL MODE: the cluster, the GPUs, Redis and the OIDC issuer are simulated or embedded.\n")
	fmt.Fprintf(&b, "API:      %s/api/v1/\n", base)
	fmt.Fprintf(&b, "OpenAPI:  %s/api/v1/openapi.yaml\n", base)
	if web != "" {
		fmt.Fprintf(&b, "Web:      %s/  (signs you in as %s, an admin; %s%s?login_hint=%s for a non-admin)\n", web, devUser, web, auth.LoginPath, devGuest)
	}
	if token != "" {
		fmt.Fprintf(&b, "\nCreate a server (profile %q) as the dev user:\n", profile)
		fmt.Fprintf(&b, "  curl -sS -X PUT -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{\"profile\":\"%s\"}' %s/api/v1/users/%s/servers/demo\n",
			token, profile, base, devUser)
		fmt.Fprintf(&b, "\nWatch it start (server-sent events):\n")
		fmt.Fprintf(&b, "  curl -sS -N -H 'Authorization: Bearer %s' %s/api/v1/users/%s/servers/demo/events\n", token, base, devUser)
		if web != "" {
			fmt.Fprintf(&b, "\nOpen the notebook in a browser (the broker's proxy; signed in as %s):\n  %s/user/%s/demo/\n", devUser, web, devUser)
		}
		fmt.Fprintf(&b, "\nThe token is valid for %s.\n", devTokenTTL)
	}
	if hubTokenFile != "" {
		fmt.Fprintf(&b, "\nJupyterHub (the gpubroker-jupyterhub spawner class) acts for its users with the token in %s:\n", hubTokenFile)
		fmt.Fprintf(&b, "  c.JupyterHub.spawner_class = \"gpubroker\"\n  c.GPUBrokerSpawner.broker_url = %q\n  c.GPUBrokerSpawner.hub_token_file = %q\n", base, hubTokenFile)
	}
	fmt.Fprintf(&b, "Stop with Ctrl-C.\n\n")
	fmt.Fprint(w, b.String())
}
