package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// Mode is how notebooks are addressed.
type Mode string

// The modes.
const (
	// ModeHost serves each server on its own host name under a notebook
	// domain, so notebooks never share a browser origin with each other or
	// with the broker's pages (ARCHITECTURE.md invariant 7).
	ModeHost Mode = "host"
	// ModePath serves every notebook under /user/<user>/<server>/ of the
	// broker's own origin: simpler (no wildcard DNS or certificate), but
	// every notebook page shares one origin with all the others and with the
	// broker's pages.
	ModePath Mode = "path"
)

// Defaults applied by New.
const (
	DefaultHandoffTTL     = time.Minute
	DefaultHostSessionTTL = 12 * time.Hour
	DefaultSessionCheck   = 5 * time.Second
	DefaultActivityFlush  = 10 * time.Second
)

// HandoffPath is the path on a notebook host that redeems a hand-off code.
// It lies outside every notebook's base URL (/user/...), so no notebook can
// serve it.
const HandoffPath = "/.gpubroker/handoff"

// Config configures a Proxy.
type Config struct {
	// Mode chooses host or path addressing; required.
	Mode Mode
	// PublicURL is the broker's external base URL (scheme and host, no
	// path), e.g. "https://gpubroker.example.com"; required. Path mode
	// serves notebooks there; host mode hands off from there.
	PublicURL string
	// Domain is host mode's notebook domain: server (user, name) is served
	// at <spawner.PodName(user, name)>.<Domain>, with the scheme and port of
	// PublicURL. Required in host mode; a DNS name, no scheme or port.
	Domain string
	// AdminAccess lets admins open other users' notebooks; off by default.
	AdminAccess bool
	// HandoffTTL is how long a hand-off code may be redeemed; default
	// DefaultHandoffTTL.
	HandoffTTL time.Duration
	// HostSessionTTL caps a notebook host's session (it never outlives the
	// web session it came from); default DefaultHostSessionTTL.
	HostSessionTTL time.Duration
	// SessionCheck is how long a checked web session (path mode, and the
	// host mode entry) or host session is trusted before it is read again
	// (a web sign-out takes effect within it); default DefaultSessionCheck.
	SessionCheck time.Duration
	// ActivityFlush is how often Run writes the activity it saw; default
	// DefaultActivityFlush.
	ActivityFlush time.Duration
	// Replica names this broker replica in the activity records; default a
	// random name.
	Replica string
}

// Servers reads server records (redisstore.Store).
type Servers interface {
	GetServer(ctx context.Context, k fleet.ServerKey) (fleet.Server, error)
	ListServers(ctx context.Context, user string) ([]fleet.Server, error)
}

// Pods finds a server's pod by the slugs of its base URL (spawner.Client).
type Pods interface {
	PodBySlugs(userSlug, serverSlug string) (spawner.ManagedPod, bool, error)
}

// Tokens reads a spawn's notebook token (spawner.Client.NotebookToken,
// which keeps each spawn's token after its first read).
type Tokens interface {
	NotebookToken(ctx context.Context, user, server, spawnID string) (string, error)
}

// Sessions reads the web session of a request (auth.Web).
type Sessions interface {
	Session(ctx context.Context, r *http.Request) (auth.Session, error)
}

// Handoffs keeps host mode's one-time codes and notebook host sessions
// (redisstore.Notebooks). Values are opaque bytes; keys hold digests of
// the code and cookie values, never the values.
type Handoffs interface {
	// PutHandoff stores a code's value for ttl.
	PutHandoff(ctx context.Context, code string, v []byte, ttl time.Duration) error
	// TakeHandoff returns and deletes a code's value in one step.
	TakeHandoff(ctx context.Context, code string) (v []byte, ok bool, err error)
	// PutHostSession stores a notebook host session for ttl.
	PutHostSession(ctx context.Context, id string, v []byte, ttl time.Duration) error
	// HostSession returns a notebook host session's value.
	HostSession(ctx context.Context, id string) (v []byte, ok bool, err error)
	// WebSessionAlive reports whether the web session whose cookie value
	// has the hex SHA-256 digest still exists.
	WebSessionAlive(ctx context.Context, digest string) (bool, error)
}

// ActivityStore receives what the proxy saw of each spawn
// (redisstore.Notebooks): this replica's record of spawnID, written at.
type ActivityStore interface {
	PutActivity(ctx context.Context, spawnID, replica string, a fleet.ProxyActivity, at time.Time) error
}

// Pages renders the pages of notebooks that cannot be proxied now
// (frontend.Handler).
type Pages interface {
	// Notebook answers with status a page about server (user, name): its
	// state (stopped, with a way to start it; starting, following the
	// spawn's progress and entering the notebook once it runs) and problem
	// when not "" (a sentence, e.g. the notebook is not answering).
	Notebook(w http.ResponseWriter, r *http.Request, status int, user, name, problem string)
	// Error answers status with a page saying msg (a sentence).
	Error(w http.ResponseWriter, r *http.Request, status int, msg string)
}

// Deps are the Proxy's parts. Servers, Pods, Tokens, Sessions and Pages
// are required; Handoffs in host mode.
type Deps struct {
	Servers  Servers
	Pods     Pods
	Tokens   Tokens
	Sessions Sessions
	// Bearer accepts "Authorization: Bearer" tokens for the owner; nil
	// accepts none.
	Bearer   auth.Authenticator
	Handoffs Handoffs
	// Activity receives the per-spawn activity; nil keeps it in memory only.
	Activity ActivityStore
	Pages    Pages
	// Transport reaches the notebooks; nil means a tuned default.
	Transport http.RoundTripper
	Log       *slog.Logger
	// Now is the clock of activity and sessions; nil means time.Now.
	Now func() time.Time
	// Metrics counts the proxied connections; nil counts nothing.
	Metrics Metrics
}

// Metrics counts the requests the proxy is forwarding to notebooks
// (implemented by broker/internal/metrics): ProxyOpened when one starts,
// ProxyClosed when it ends (a WebSocket when it closes). Its methods must
// be safe for concurrent use and must not block.
type Metrics interface {
	ProxyOpened()
	ProxyClosed()
}

// noMetrics counts nothing.
type noMetrics struct{}

func (noMetrics) ProxyOpened() {}
func (noMetrics) ProxyClosed() {}

// Proxy serves notebooks to their owners. Create it with New; serve it
// with Handler; run Run for the activity records. Safe for concurrent use.
type Proxy struct {
	cfg    Config
	deps   Deps
	log    *slog.Logger
	now    func() time.Time
	public *url.URL
	secure bool

	forward  http.Handler
	keys     *keyCache
	records  *ttlCache[fleet.ServerKey, fleet.Server] // running servers' records, for recordTTL
	hosts    *ttlCache[string, hostSession]           // checked host sessions by id digest, for SessionCheck
	webs     *ttlCache[string, auth.Session]          // checked web sessions by cookie digest, for SessionCheck
	activity *tracker
}

// New checks cfg and deps and returns a Proxy.
func New(cfg Config, deps Deps) (*Proxy, error) {
	var errs []error
	if cfg.Mode != ModeHost && cfg.Mode != ModePath {
		errs = append(errs, fmt.Errorf("proxy: mode %q must be host or path", cfg.Mode))
	}
	pub, err := url.Parse(cfg.PublicURL)
	if err != nil || (pub.Scheme != "http" && pub.Scheme != "https") || pub.Host == "" || strings.Trim(pub.Path, "/") != "" {
		errs = append(errs, fmt.Errorf("proxy: public URL %q must be http(s)://host[:port] without a path", cfg.PublicURL))
	}
	if cfg.Mode == ModeHost {
		d := strings.ToLower(strings.Trim(cfg.Domain, "."))
		if d == "" || strings.ContainsAny(d, ":/ ") {
			errs = append(errs, fmt.Errorf("proxy: host mode needs a notebook domain (a DNS name), got %q", cfg.Domain))
		}
		cfg.Domain = d
		if deps.Handoffs == nil {
			errs = append(errs, errors.New("proxy: host mode needs the hand-off store"))
		}
	}
	for name, missing := range map[string]bool{"Servers": deps.Servers == nil, "Pods": deps.Pods == nil, "Tokens": deps.Tokens == nil, "Sessions": deps.Sessions == nil, "Pages": deps.Pages == nil} {
		if missing {
			errs = append(errs, fmt.Errorf("proxy: Deps.%s is nil", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.HandoffTTL <= 0 {
		cfg.HandoffTTL = DefaultHandoffTTL
	}
	if cfg.HostSessionTTL <= 0 {
		cfg.HostSessionTTL = DefaultHostSessionTTL
	}
	if cfg.SessionCheck <= 0 {
		cfg.SessionCheck = DefaultSessionCheck
	}
	if cfg.ActivityFlush <= 0 {
		cfg.ActivityFlush = DefaultActivityFlush
	}
	if cfg.Replica == "" {
		cfg.Replica = "replica-" + rand.Text()[:8]
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Metrics == nil {
		deps.Metrics = noMetrics{}
	}
	p := &Proxy{
		cfg: cfg, deps: deps, log: deps.Log, now: deps.Now, public: &url.URL{Scheme: pub.Scheme, Host: pub.Host},
		secure: pub.Scheme == "https",
		keys:   newKeyCache(), records: newTTLCache[fleet.ServerKey, fleet.Server](), hosts: newTTLCache[string, hostSession](),
		webs: newTTLCache[string, auth.Session](), activity: newTracker(),
	}
	p.forward = p.newForwarder(deps.Transport)
	return p, nil
}

// OpenURL is the browser's address of server (user, name): its base URL on
// the broker's origin. In host mode that address hands the browser off to
// the server's own host.
func (p *Proxy) OpenURL(user, name string) string {
	return p.public.String() + spawner.BaseURL(user, name)
}

// Handler returns the broker's root handler with the notebooks in it:
// requests for a notebook host (host mode) and for /user/... on the
// broker's origin go to the proxy, everything else to next.
func (p *Proxy) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if label, ok := p.notebookHost(r.Host); ok {
			p.serveHost(w, r, label)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/user/") {
			if p.cfg.Mode == ModeHost {
				p.serveEntry(w, r)
			} else {
				p.servePath(w, r)
			}
			return
		}
		next.ServeHTTP(w, r)
	})
}

// notebookHost returns the first label of host when it is a host under the
// notebook domain (host mode only).
func (p *Proxy) notebookHost(host string) (string, bool) {
	if p.cfg.Mode != ModeHost {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+p.cfg.Domain)
	if !ok || label == "" || strings.Contains(label, ".") {
		return "", false
	}
	return label, true
}

// hostOrigin is the origin of a notebook host.
func (p *Proxy) hostOrigin(label string) string {
	u := *p.public
	host := label + "." + p.cfg.Domain
	if port := p.public.Port(); port != "" {
		host = net.JoinHostPort(host, port)
	}
	u.Host = host
	return u.String()
}

// target is a parsed notebook path: /user/<userSlug>/<serverSlug>/<rest>.
type target struct {
	userSlug, serverSlug string
}

// parseTarget reads the slugs of a notebook path (the escaped form, as the
// browser sent it); ok is false for a path that names no notebook.
// slash reports whether the base URL's closing slash is there.
func parseTarget(r *http.Request) (t target, slash, ok bool) {
	rest, found := strings.CutPrefix(r.URL.EscapedPath(), "/user/")
	if !found {
		return t, false, false
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) < 2 || !isSlug(parts[0]) || !isSlug(parts[1]) {
		return t, false, false
	}
	return target{parts[0], parts[1]}, len(parts) == 3, true
}

// isSlug reports whether s could be a spawner slug: a DNS-1123 label.
func isSlug(s string) bool {
	if s == "" || len(s) > spawner.MaxNameLen || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// wantsPage reports whether r is a browser navigation that should get a
// page (or a redirect) rather than a bare status.
func wantsPage(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if isUpgrade(r) {
		return false
	}
	if d := r.Header.Get("Sec-Fetch-Dest"); d != "" {
		return d == "document"
	}
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") ||
		headerHasToken(r.Header, "Connection", "upgrade")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// servePath serves path mode's /user/... on the broker's origin.
func (p *Proxy) servePath(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, slash, ok := parseTarget(r)
	if !ok {
		p.notFound(w, r)
		return
	}
	pr, _, err := p.webPrincipal(ctx, r)
	if err != nil {
		p.refuse(w, r, err)
		return
	}
	srv, ok := p.found(w, r, t, pr)
	if !ok {
		return
	}
	if !slash {
		http.Redirect(w, r, spawner.BaseURL(srv.User, srv.Name), http.StatusFound)
		return
	}
	if srv.State != fleetRunning || srv.URL == "" {
		p.notRunning(w, r, srv)
		return
	}
	p.proxyTo(w, r, srv, p.public.String())
}

// serveEntry serves host mode's /user/... on the broker's origin: the
// status page of a server that is not running, else the hand-off to the
// server's host.
func (p *Proxy) serveEntry(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, _, ok := parseTarget(r)
	if !ok {
		p.notFound(w, r)
		return
	}
	sess, err := p.webSession(ctx, r)
	if err != nil {
		p.refuse(w, r, err)
		return
	}
	srv, ok := p.found(w, r, t, sess.Principal)
	if !ok {
		return
	}
	if srv.State != fleetRunning || srv.URL == "" {
		p.notRunning(w, r, srv)
		return
	}
	p.handOff(w, r, srv, sess)
}

// serveHost serves a notebook host: the hand-off, and the notebook to the
// holder of a host session (or a bearer token) for its owner.
func (p *Proxy) serveHost(w http.ResponseWriter, r *http.Request, label string) {
	ctx := r.Context()
	if r.URL.Path == HandoffPath {
		p.redeem(w, r, label)
		return
	}
	t, slash, ok := parseTarget(r)
	if !ok {
		p.notFound(w, r)
		return
	}
	pr, hs, err := p.hostPrincipal(ctx, r, label)
	if err != nil {
		if wantsPage(r) && errors.Is(err, auth.ErrUnauthenticated) {
			// Sign in (or refresh the host's session) on the broker's origin.
			http.Redirect(w, r, p.public.String()+r.URL.RequestURI(), http.StatusSeeOther)
			return
		}
		p.refuse(w, r, err)
		return
	}
	srv, ok := p.found(w, r, t, pr)
	if !ok {
		return
	}
	if spawner.PodName(srv.User, srv.Name) != label {
		p.notFound(w, r)
		return
	}
	if hs != nil && (hs.User != srv.User || hs.Server != srv.Name || hs.SpawnID != srv.SpawnID) {
		// A session for an earlier start of this server: start over.
		if wantsPage(r) {
			http.Redirect(w, r, p.public.String()+r.URL.RequestURI(), http.StatusSeeOther)
			return
		}
		p.refuse(w, r, auth.ErrNoCredentials)
		return
	}
	if !slash {
		http.Redirect(w, r, spawner.BaseURL(srv.User, srv.Name), http.StatusFound)
		return
	}
	if srv.State != fleetRunning || srv.URL == "" {
		if wantsPage(r) {
			http.Redirect(w, r, p.public.String()+r.URL.RequestURI(), http.StatusSeeOther)
			return
		}
		plain(w, http.StatusServiceUnavailable, "not_running", "the notebook server is "+string(srv.State))
		return
	}
	p.proxyTo(w, r, srv, p.hostOrigin(label))
}

// found resolves t for pr, answering the request itself (404, or 503 when
// the lookup failed) when ok is false.
func (p *Proxy) found(w http.ResponseWriter, r *http.Request, t target, pr auth.Principal) (fleet.Server, bool) {
	srv, ok, err := p.resolve(r.Context(), t, pr)
	switch {
	case err != nil:
		p.unavailable(w, r, err)
	case !ok:
		p.notFound(w, r)
	}
	return srv, err == nil && ok
}
