package app

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	nvmlgpus "github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	nvmlserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/kubernetes"

	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/spawner/devcluster"
)

// Dev mode's fixed names.
const (
	devUser     = "dev"
	devGuest    = "alice"
	devNode     = "dgx-h200-sim"
	devTokenTTL = 24 * time.Hour
)

// buildDev wires the parts for `gpubroker dev`, embedding whatever cfg
// leaves unset, and prints the banner with a ready-to-paste command.
func buildDev(ctx context.Context, cfg config.Config, log *slog.Logger, ln net.Listener, stdout io.Writer) (*parts, error) {
	var simulated []string
	var background []func(context.Context) error
	var closers []func()
	fail := func(err error) (*parts, error) {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		return nil, err
	}

	cat := catalog.Default()
	if cfg.ProfilesFile != "" {
		c, err := catalog.Load(cfg.ProfilesFile)
		if err != nil {
			return fail(fmt.Errorf("profiles file %s: %w", cfg.ProfilesFile, err))
		}
		cat = c
	}

	var rdb redis.UniversalClient
	if cfg.Redis.URL == "" && cfg.Redis.SentinelMaster == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return fail(fmt.Errorf("embedded redis: %w", err))
		}
		closers = append(closers, mr.Close)
		rdb = redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		simulated = append(simulated, "Redis is embedded (miniredis, in memory: data is lost at exit)")
	} else {
		c, err := cfg.Redis.Client()
		if err != nil {
			return fail(err)
		}
		rdb = c
	}
	closers = append(closers, func() { rdb.Close() })

	issuerURL, audience := cfg.OIDCIssuer, cfg.OIDCAudience
	publicURL := devPublicURL(cfg, ln)
	var ws *webSettings
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
		background = append(background, func(ctx context.Context) error { return iss.Serve(ctx, il) })
		ws = &webSettings{issuerURL: issuerURL, clientID: audience, clientSecret: secret, publicURL: publicURL}
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
		ws = &webSettings{issuerURL: issuerURL, clientID: cfg.ClientID(), clientSecret: secret.Reveal(), publicURL: publicURL}
	}
	bearer, err := auth.NewBearer(ctx, auth.BearerConfig{
		IssuerURL: issuerURL, Audience: audience,
		UsernameClaim: cfg.OIDCUsernameClaim, GroupsClaim: cfg.OIDCGroupsClaim, AdminGroup: cfg.AdminGroup,
	})
	if err != nil {
		return fail(err)
	}

	var kube kubernetes.Interface
	if cfg.Kube.Kubeconfig == "" {
		cl := devcluster.New([]string{devNode}, log.With("part", "devcluster"), devcluster.WithNamespace(cfg.Namespace))
		kube = cl.Clientset()
		background = append(background, cl.Run)
		simulated = append(simulated, "the Kubernetes cluster is simulated: one node, "+devNode+"; pods do not really run")
	} else {
		kube, err = kubeClient(cfg.Kube)
		if err != nil {
			return fail(err)
		}
	}

	gpuNote := fmt.Sprintf("the GPUs are simulated (%d× NVIDIA H200 from go-nvml's mock/dgxh200) on node %s", cfg.DevGPUs, devNode)
	notice := "LOCAL DEV MODE: " + strings.Join(append(simulated, gpuNote), "; ") + "."
	p, err := assemble(cfg, log, rdb, kube, cat, bearer, auth.NewHubToken(""), httpapi.Mode{Simulated: true, Notice: notice}, ws)
	if err != nil {
		return fail(err)
	}
	p.background = background
	p.closers = closers

	if err := registerSimulatedGPUs(ctx, p, devNode, cfg.DevGPUs); err != nil {
		p.close()
		return nil, err
	}
	for _, s := range append(simulated, gpuNote) {
		log.Warn("dev mode: " + s)
	}
	web := ""
	if ws != nil {
		web = ws.publicURL
	}
	p.started = func() { printBanner(stdout, "http://"+ln.Addr().String(), web, token, cat.Profiles()) }
	return p, nil
}

// registerSimulatedGPUs registers count simulated H200 GPUs for placement,
// discovered through the same code the node agent uses. Their UUIDs are fixed
// (GPU-00000000-0000-4000-8000-00000000000N; go-nvml's mock draws random
// ones), so dev runs against one real Redis reuse the same GPUs instead of
// adding phantom ones each time.
func registerSimulatedGPUs(ctx context.Context, p *parts, node string, count int) error {
	lib := dgxh200.NewWithGPUs(nvmlgpus.Multiple(count, nvmlgpus.H200_SXM5_141GB)...)
	for i, d := range lib.Devices {
		uuid := fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i)
		d.(*nvmlserver.Device).GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
	}
	gpus, err := agent.Discover(lib, node)
	if err != nil {
		return fmt.Errorf("simulated gpus: %w", err)
	}
	for _, g := range gpus {
		if err := p.store.RegisterGPU(ctx, fleet.GPU{UUID: g.UUID, Node: g.Node, Model: g.Model,
			MemoryMiB: g.MemoryMiB, SMCount: g.SMCount, Healthy: g.Healthy}); err != nil {
			return fmt.Errorf("register simulated gpu %s: %w", g.UUID, err)
		}
	}
	return nil
}

// printBanner tells a newcomer what runs and gives commands to paste.
func printBanner(w io.Writer, base, web, token string, profiles []fleet.Profile) {
	profile := "small"
	if len(profiles) > 0 {
		profile = profiles[0].Name
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\ngpubroker dev — LOCAL MODE: the cluster, the GPUs, Redis and the OIDC issuer are simulated or embedded.\n")
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
		fmt.Fprintf(&b, "\nThe token is valid for %s.\n", devTokenTTL)
	}
	fmt.Fprintf(&b, "Stop with Ctrl-C.\n\n")
	fmt.Fprint(w, b.String())
}
