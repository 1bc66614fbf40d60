package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/proxy"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/frontend"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// WebSettings turn the web login and pages on; nil leaves them off (serve
// mode without --public-url).
type WebSettings struct {
	// IssuerURL is the OIDC issuer of the web login; ClientID and
	// ClientSecret ("" for a public client, PKCE only) the broker's client
	// there.
	IssuerURL    string
	ClientID     string
	ClientSecret string
	// PublicURL is the broker's external base URL; the login's redirect URI
	// is PublicURL + auth.CallbackPath.
	PublicURL string
}

// serveWebSettings reads the web login's settings of a serve config: off
// without a public URL.
func serveWebSettings(cfg config.Config, log *slog.Logger) (*WebSettings, error) {
	if cfg.PublicURL == "" {
		log.Info("web pages are off: set --public-url to serve them (the web login's redirect URI is <public-url>/auth/callback)")
		return nil, nil
	}
	secret, err := cfg.ClientSecret()
	if err != nil {
		return nil, err
	}
	return &WebSettings{IssuerURL: cfg.OIDCIssuer, ClientID: cfg.ClientID(), ClientSecret: secret.Reveal(), PublicURL: cfg.PublicURL}, nil
}

// pagesProxy lets the web login render with the frontend built after it.
type pagesProxy struct{ h *frontend.Handler }

func (p *pagesProxy) LoginFailed(w http.ResponseWriter, r *http.Request, status int, reason string) {
	p.h.LoginFailed(w, r, status, reason)
}

func (p *pagesProxy) SignedOut(w http.ResponseWriter, r *http.Request) { p.h.SignedOut(w, r) }

// Notebook and Error render the notebook proxy's pages.
func (p *pagesProxy) Notebook(w http.ResponseWriter, r *http.Request, status int, user, name, problem string) {
	p.h.Notebook(w, r, status, user, name, problem)
}

func (p *pagesProxy) Error(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p.h.Error(w, r, status, msg)
}

var _ proxy.Pages = (*pagesProxy)(nil)

// newNotebookProxy builds the notebook proxy next to the web pages: server
// records and host-mode records in Redis, pods and tokens from the
// spawner, sign-in by the web session or a bearer token.
func newNotebookProxy(cfg config.Config, ws *WebSettings, log *slog.Logger, p *parts, web *auth.Web, bearer *auth.Bearer, pages *pagesProxy) (*proxy.Proxy, error) {
	nb := redisstore.NewNotebooks(p.redis, cfg.Redis.Prefix)
	px, err := proxy.New(proxy.Config{
		Mode: proxy.Mode(cfg.NotebookMode), PublicURL: strings.TrimSuffix(ws.PublicURL, "/"), Domain: cfg.NotebookDomain,
		AdminAccess: cfg.NotebookAdminAccess, HostSessionTTL: cfg.SessionTTL,
	}, proxy.Deps{
		Servers: p.store, Pods: p.spawner, Tokens: p.spawner, Sessions: web, Bearer: bearer,
		Handoffs: nb, Activity: nb, Pages: pages, Log: log.With("part", "proxy"), Metrics: p.metrics.Broker,
	})
	if err != nil {
		return nil, fmt.Errorf("notebook proxy: %w", err)
	}
	return px, nil
}

var _ auth.SessionStore = (*redisstore.Sessions)(nil)

// newWebLogin builds the web login over rdb; pages render through proxy.
func newWebLogin(cfg config.Config, ws *WebSettings, rdb redis.UniversalClient, log *slog.Logger, proxy *pagesProxy) (*auth.Web, error) {
	w, err := auth.NewWeb(auth.WebConfig{
		IssuerURL: ws.IssuerURL, ClientID: ws.ClientID, ClientSecret: ws.ClientSecret, PublicURL: ws.PublicURL,
		UsernameClaim: cfg.OIDCUsernameClaim, GroupsClaim: cfg.OIDCGroupsClaim, AdminGroup: cfg.AdminGroup,
		SessionTTL: cfg.SessionTTL,
	}, redisstore.NewSessions(rdb, cfg.Redis.Prefix), auth.WithPages(proxy), auth.WithWebLogger(log.With("part", "weblogin")))
	if err != nil {
		return nil, fmt.Errorf("web login: %w", err)
	}
	return w, nil
}

// webSessions adapts the web login's sessions to the pages' Sessions.
type webSessions struct{ w *auth.Web }

func (s webSessions) Viewer(ctx context.Context, r *http.Request) (frontend.Viewer, error) {
	sess, err := s.w.Session(ctx, r)
	if errors.Is(err, auth.ErrUnauthenticated) {
		return frontend.Viewer{}, fmt.Errorf("%w: %w", frontend.ErrSignedOut, err)
	}
	if err != nil {
		return frontend.Viewer{}, err
	}
	p := sess.Principal
	return frontend.Viewer{User: p.User, Groups: p.Groups, Admin: p.Admin, CSRF: sess.CSRF}, nil
}

// mountPages returns the broker's root handler: the API (and probes) as
// they are, the web login under /auth/, and the pages everywhere else.
func mountPages(api http.Handler, w *auth.Web, proxy *pagesProxy, usage frontend.Usage, log *slog.Logger, notice string) (http.Handler, error) {
	pages, err := frontend.New(frontend.Deps{API: api, Sessions: webSessions{w}, Usage: usage, Log: log.With("part", "frontend"), Notice: notice})
	if err != nil {
		return nil, fmt.Errorf("web pages: %w", err)
	}
	proxy.h = pages
	mux := http.NewServeMux()
	mux.Handle("/api/", api)
	mux.Handle("/healthz", api)
	mux.Handle("/readyz", api)
	mux.Handle("/auth/", w.Handler())
	mux.Handle("/", pages)
	return apiFirst(api, mux), nil
}

// apiFirst sends the API's paths (/api/ and the probes) to api as they
// came, and everything else to rest. http.ServeMux would clean an API path
// with "." or ".." segments and answer with a redirect; the API never
// redirects: such a path is the API's own 400 or 404, in JSON.
func apiFirst(api, rest http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if strings.HasPrefix(p, "/api/") || p == "/api" || p == "/healthz" || p == "/readyz" {
			api.ServeHTTP(w, r)
			return
		}
		rest.ServeHTTP(w, r)
	})
}

// redirectHost is the host part of a URL, for log lines.
func redirectHost(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return p.Host
}

// usageWindow is how many of a slice's newest samples a usage chart shows.
const usageWindow = 360

// agentUsage reads the node agents' usage samples for the pages. now is
// the clock that judges staleness (nil: time.Now).
type agentUsage struct {
	agents *agentstore.Store
	clock  func() time.Time
}

func (u agentUsage) now() time.Time {
	if u.clock == nil {
		return time.Now()
	}
	return u.clock()
}

var _ frontend.Usage = agentUsage{}

// Samples returns the spawn's newest samples, oldest first. Samples whose
// SM or memory reading is missing are left out: missing is never zero.
func (u agentUsage) Samples(ctx context.Context, _, _, spawnID string) ([]frontend.Sample, error) {
	ss, err := u.agents.RecentSamples(ctx, spawnID, usageWindow)
	if err != nil {
		return nil, err
	}
	out := make([]frontend.Sample, 0, len(ss))
	for i := len(ss) - 1; i >= 0; i-- {
		s := ss[i]
		if s.SMPercent == nil || s.MemoryUsedMiB == nil {
			continue
		}
		out = append(out, frontend.Sample{Time: s.At, SMPercent: float64(*s.SMPercent), MemoryMiB: *s.MemoryUsedMiB})
	}
	return out, nil
}

// Current returns the spawn's newest sample if it is fresh and complete.
func (u agentUsage) Current(ctx context.Context, _, _, spawnID string) (frontend.Sample, bool, error) {
	s, err := u.agents.LatestSample(ctx, spawnID)
	if errors.Is(err, agentstore.ErrNotFound) {
		return frontend.Sample{}, false, nil
	}
	if err != nil {
		return frontend.Sample{}, false, err
	}
	if s.Stale(u.now()) || s.SMPercent == nil || s.MemoryUsedMiB == nil {
		return frontend.Sample{}, false, nil
	}
	return frontend.Sample{Time: s.At, SMPercent: float64(*s.SMPercent), MemoryMiB: *s.MemoryUsedMiB}, true, nil
}
