package auth

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
	"golang.org/x/sync/singleflight"
)

// Paths the web login serves (Web.Handler), relative to the broker's root.
const (
	LoginPath     = "/auth/login"      // GET: start a sign-in; ?next=/local/path, ?login_hint=user
	CallbackPath  = "/auth/callback"   // GET: the identity provider's redirect
	LogoutPath    = "/auth/logout"     // POST with the CSRF field: end the session
	SignedOutPath = "/auth/signed-out" // GET: the page after logout
)

// Cookie names and the CSRF form field and header.
const (
	SessionCookie = "gpubroker_session"
	loginCookie   = "gpubroker_login"
	// CSRFField is the form field that carries the session's CSRF token.
	CSRFField = "csrf"
	// CSRFHeader is the header that API calls authenticated by the session
	// cookie must send, with the CSRF token, on every method but GET, HEAD
	// and OPTIONS.
	CSRFHeader = "X-CSRF-Token"
)

// Defaults of WebConfig.
const (
	DefaultSessionTTL  = 12 * time.Hour
	DefaultRefreshSkew = 30 * time.Second
	// loginTTL bounds the time between /auth/login and the callback.
	loginTTL = 10 * time.Minute
	// refreshTimeout bounds one refresh, the waiting of other replicas
	// included.
	refreshTimeout = 15 * time.Second
)

// ErrCSRF means a state-changing request authenticated by the session
// cookie did not carry the session's CSRF token. The HTTP layer answers 403.
var ErrCSRF = errors.New("auth: the request lacks this session's CSRF token; reload the page and try again")

// errSessionEnded is the reason given for a session that is gone.
var errSessionEnded = &Error{Reason: "your session has ended; sign in again"}

// WebConfig configures the web login (authorization-code flow with PKCE).
type WebConfig struct {
	// IssuerURL is the OIDC issuer; required, absolute http(s).
	IssuerURL string
	// ClientID is the broker's client id at the issuer, also the ID tokens'
	// audience; required.
	ClientID string
	// ClientSecret is the client secret; "" for a public client (PKCE only).
	ClientSecret string
	// PublicURL is the broker's external base URL, for example
	// https://gpu.example.org; the redirect URI is PublicURL+CallbackPath.
	// Required. Cookies are Secure when it is https.
	PublicURL string
	// UsernameClaim, GroupsClaim and AdminGroup read the ID token as
	// BearerConfig's fields of the same names read bearer tokens.
	UsernameClaim string
	GroupsClaim   string
	AdminGroup    string
	// Scopes are requested at sign-in; nil means openid, profile, email.
	Scopes []string
	// SessionTTL is a session's absolute lifetime; default DefaultSessionTTL.
	SessionTTL time.Duration
	// RefreshSkew is how long before the tokens expire a request refreshes
	// them; default DefaultRefreshSkew.
	RefreshSkew time.Duration
}

// Pages renders the few answers of the web login that are pages. The
// frontend implements it; the default writes plain text.
type Pages interface {
	// LoginFailed answers a sign-in that could not complete with status
	// (400, or 503 when the issuer cannot be reached) and a reason a person
	// understands; the page offers a fresh sign-in at LoginPath.
	LoginFailed(w http.ResponseWriter, r *http.Request, status int, reason string)
	// SignedOut is the page shown after logout.
	SignedOut(w http.ResponseWriter, r *http.Request)
}

// Session is a signed-in browser session as the pages see it.
type Session struct {
	Principal Principal
	// CSRF is the token that forms (CSRFField) and API calls (CSRFHeader)
	// of this session must carry.
	CSRF string
	// Expires is when the session ends at the latest.
	Expires time.Time
}

// Web is the web login: the /auth/* handlers, server-side sessions in Redis
// behind an opaque cookie, and an Authenticator for requests that carry the
// session cookie. Create it with NewWeb. Safe for concurrent use.
type Web struct {
	cfg    WebConfig
	store  SessionStore
	now    func() time.Time
	client *http.Client
	pages  Pages
	log    *slog.Logger
	secure bool
	claims *Bearer // reads claims only (principal); never verifies

	mu       sync.Mutex
	provider *oidc.Provider // nil until discovery succeeded
	idv      *oidc.IDTokenVerifier
	endURL   string // end_session_endpoint, "" if none

	flight singleflight.Group // one refresh per session per process
}

var _ Authenticator = (*Web)(nil)

// WebOption configures NewWeb.
type WebOption func(*Web)

// WithWebClock sets the clock for session lifetimes, refresh timing and ID
// token expiry; default time.Now.
func WithWebClock(now func() time.Time) WebOption { return func(w *Web) { w.now = now } }

// WithPages sets the renderer of the login's pages.
func WithPages(p Pages) WebOption { return func(w *Web) { w.pages = p } }

// WithWebLogger sets the logger for sign-in failures (reasons only, never
// tokens); default discards.
func WithWebLogger(l *slog.Logger) WebOption { return func(w *Web) { w.log = l } }

// NewWeb checks cfg and returns a Web that keeps its sign-ins and sessions
// in store. It does no I/O: discovery runs on the first sign-in or refresh
// and is retried after a failure.
func NewWeb(cfg WebConfig, store SessionStore, opts ...WebOption) (*Web, error) {
	var errs []error
	if u, err := url.Parse(cfg.IssuerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("issuer URL %q is not an absolute http(s) URL", cfg.IssuerURL))
	}
	pub, err := url.Parse(cfg.PublicURL)
	if err != nil || (pub.Scheme != "http" && pub.Scheme != "https") || pub.Host == "" {
		errs = append(errs, fmt.Errorf("public URL %q is not an absolute http(s) URL", cfg.PublicURL))
	}
	if strings.TrimSpace(cfg.ClientID) == "" {
		errs = append(errs, errors.New("client id is empty"))
	}
	if store == nil {
		errs = append(errs, errors.New("session store is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("auth: web login config: %w", err)
	}
	cfg.PublicURL = strings.TrimSuffix(cfg.PublicURL, "/")
	if cfg.Scopes == nil {
		cfg.Scopes = []string{oidc.ScopeOpenID, "profile", "email"}
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.RefreshSkew <= 0 {
		cfg.RefreshSkew = DefaultRefreshSkew
	}
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = DefaultUsernameClaim
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = DefaultGroupsClaim
	}
	w := &Web{
		cfg: cfg, store: store, now: time.Now,
		client: &http.Client{Timeout: 10 * time.Second},
		pages:  textPages{}, log: slog.New(slog.DiscardHandler),
		secure: pub.Scheme == "https",
		claims: &Bearer{cfg: BearerConfig{UsernameClaim: cfg.UsernameClaim, GroupsClaim: cfg.GroupsClaim, AdminGroup: cfg.AdminGroup}},
	}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// Handler serves LoginPath, CallbackPath, LogoutPath and SignedOutPath.
func (w *Web) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+LoginPath, w.login)
	mux.HandleFunc("GET "+CallbackPath, w.callback)
	mux.HandleFunc("POST "+LogoutPath, w.logout)
	mux.HandleFunc("GET "+SignedOutPath, func(rw http.ResponseWriter, r *http.Request) { w.pages.SignedOut(rw, r) })
	return mux
}

// discover returns the provider and the oauth2 config, running discovery
// when it has not succeeded yet. Failures match ErrUnavailable.
func (w *Web) discover(ctx context.Context) (*oidc.Provider, *oauth2.Config, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.provider == nil {
		dctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, w.client), DefaultDiscoveryTimeout)
		defer cancel()
		p, err := oidc.NewProvider(dctx, w.cfg.IssuerURL)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %s: discovery: %w", ErrUnavailable, w.cfg.IssuerURL, err)
		}
		var meta struct {
			EndSession string `json:"end_session_endpoint"`
		}
		if err := p.Claims(&meta); err != nil {
			return nil, nil, fmt.Errorf("%w: %s: discovery document: %w", ErrUnavailable, w.cfg.IssuerURL, err)
		}
		// The verifier's key set fetches keys later, outside this
		// request, so it gets a context that this request's end does not
		// cancel.
		kctx := oidc.ClientContext(context.WithoutCancel(ctx), w.client)
		w.idv = p.VerifierContext(kctx, &oidc.Config{ClientID: w.cfg.ClientID, Now: w.now})
		w.provider, w.endURL = p, meta.EndSession
	}
	return w.provider, &oauth2.Config{
		ClientID: w.cfg.ClientID, ClientSecret: w.cfg.ClientSecret, Endpoint: w.provider.Endpoint(),
		RedirectURL: w.cfg.PublicURL + CallbackPath, Scopes: w.cfg.Scopes,
	}, nil
}

// verifier checks ID tokens: signature, issuer, audience, expiry. Call it
// after discover succeeded.
func (w *Web) verifier() *oidc.IDTokenVerifier {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.idv
}

// loginRecord is what /auth/login remembers for the callback.
type loginRecord struct {
	Verifier string `json:"verifier"`
	Nonce    string `json:"nonce"`
	Next     string `json:"next"`
}

func (w *Web) login(rw http.ResponseWriter, r *http.Request) {
	// The cookies belong to the public host; a sign-in started on another
	// name for the same server (localhost vs 127.0.0.1) moves there first.
	if pub, _ := url.Parse(w.cfg.PublicURL); r.Host != "" && !strings.EqualFold(r.Host, pub.Host) {
		http.Redirect(rw, r, w.cfg.PublicURL+LoginPath+"?"+r.URL.RawQuery, http.StatusFound)
		return
	}
	ctx := r.Context()
	_, conf, err := w.discover(ctx)
	if err != nil {
		w.fail(rw, r, http.StatusServiceUnavailable, "the identity provider cannot be reached; try again shortly", err)
		return
	}
	state, nonce, verifier := rand.Text(), rand.Text(), oauth2.GenerateVerifier()
	rec := loginRecord{Verifier: verifier, Nonce: nonce, Next: localPath(r.URL.Query().Get("next"))}
	if err := w.putLogin(ctx, state, rec); err != nil {
		w.fail(rw, r, http.StatusServiceUnavailable, "sign-in is unavailable right now (session storage); try again shortly", err)
		return
	}
	http.SetCookie(rw, &http.Cookie{Name: loginCookie, Value: state, Path: "/auth/", MaxAge: int(loginTTL / time.Second),
		HttpOnly: true, Secure: w.secure, SameSite: http.SameSiteLaxMode})
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier), oidc.Nonce(nonce)}
	if hint := r.URL.Query().Get("login_hint"); hint != "" {
		opts = append(opts, oauth2.SetAuthURLParam("login_hint", hint))
	}
	rw.Header().Set("Cache-Control", "no-store")
	http.Redirect(rw, r, conf.AuthCodeURL(state, opts...), http.StatusFound)
}

// callback finishes a sign-in. Every failure is a 400 page (503 when the
// issuer or Redis cannot be reached) that offers a fresh sign-in; the login
// record is consumed first, so a callback can succeed at most once.
func (w *Web) callback(rw http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	// The login cookie has done its job whatever happens next.
	http.SetCookie(rw, &http.Cookie{Name: loginCookie, Value: "", Path: "/auth/", MaxAge: -1,
		HttpOnly: true, Secure: w.secure, SameSite: http.SameSiteLaxMode})
	c, err := r.Cookie(loginCookie)
	state := q.Get("state")
	if err != nil || state == "" || subtle.ConstantTimeCompare([]byte(c.Value), []byte(state)) != 1 {
		w.fail(rw, r, http.StatusBadRequest, "this sign-in was not started in this browser, or it was already used (state mismatch)", nil)
		return
	}
	var rec loginRecord
	b, ok, err := w.store.TakeLogin(ctx, state)
	found, err := decodeStored(b, ok, err, &rec)
	switch {
	case err != nil:
		w.fail(rw, r, http.StatusServiceUnavailable, "sign-in is unavailable right now (session storage); try again shortly", err)
		return
	case !found:
		w.fail(rw, r, http.StatusBadRequest, "this sign-in expired or was already used", nil)
		return
	}
	if e := q.Get("error"); e != "" {
		w.fail(rw, r, http.StatusBadRequest, "the identity provider refused the sign-in: "+describeOAuthError(e, q.Get("error_description")), nil)
		return
	}
	_, conf, err := w.discover(ctx)
	if err != nil {
		w.fail(rw, r, http.StatusServiceUnavailable, "the identity provider cannot be reached; try again shortly", err)
		return
	}
	tok, err := conf.Exchange(oidc.ClientContext(ctx, w.client), q.Get("code"), oauth2.VerifierOption(rec.Verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			w.fail(rw, r, http.StatusBadRequest, "the identity provider did not accept the sign-in code: "+describeOAuthError(re.ErrorCode, re.ErrorDescription), err)
			return
		}
		w.fail(rw, r, http.StatusServiceUnavailable, "the identity provider cannot be reached; try again shortly", err)
		return
	}
	rawID, _ := tok.Extra("id_token").(string)
	if rawID == "" {
		w.fail(rw, r, http.StatusBadRequest, "the identity provider sent no ID token", nil)
		return
	}
	idt, err := w.verifier().Verify(oidc.ClientContext(ctx, w.client), rawID)
	if err != nil {
		w.fail(rw, r, http.StatusBadRequest, "the ID token did not verify", err)
		return
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(rec.Nonce)) != 1 {
		w.fail(rw, r, http.StatusBadRequest, "the ID token does not belong to this sign-in (nonce mismatch)", nil)
		return
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		w.fail(rw, r, http.StatusBadRequest, "the ID token's claims are not valid JSON", err)
		return
	}
	pr, err := w.claims.principal(idt.Subject, claims)
	if err != nil {
		var ae *Error
		errors.As(err, &ae)
		w.fail(rw, r, http.StatusBadRequest, "the ID token cannot be used: "+ae.Reason, nil)
		return
	}
	now := w.now()
	sess := sessionRecord{
		Principal: toStored(pr), CSRF: rand.Text(), IDToken: rawID, AccessToken: tok.AccessToken,
		RefreshToken: tok.RefreshToken, Expiry: tokenExpiry(tok, idt), Created: now,
	}
	id := rand.Text() + rand.Text() // 52 base32 characters, 260 bits
	if old, err := r.Cookie(SessionCookie); err == nil && old.Value != "" && len(old.Value) <= maxCookieBytes {
		// A sign-in replaces the browser's earlier session (always a new id:
		// no session fixation); the old record goes at once.
		if err := w.store.DeleteSession(ctx, old.Value); err != nil {
			w.log.WarnContext(ctx, "drop the replaced session", "err", err)
		}
	}
	if err := w.putSession(ctx, id, sess, w.cfg.SessionTTL); err != nil {
		w.fail(rw, r, http.StatusServiceUnavailable, "sign-in is unavailable right now (session storage); try again shortly", err)
		return
	}
	http.SetCookie(rw, w.sessionCookie(id, int(w.cfg.SessionTTL/time.Second)))
	rw.Header().Set("Cache-Control", "no-store")
	http.Redirect(rw, r, rec.Next, http.StatusFound)
}

func (w *Web) sessionCookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: SessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: w.secure, SameSite: http.SameSiteLaxMode}
}

// logout ends the session (CSRF-checked), then sends the browser to the
// issuer's end-session endpoint when it has one, else to SignedOutPath.
func (w *Web) logout(rw http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		http.Redirect(rw, r, SignedOutPath, http.StatusSeeOther)
		return
	}
	var rec sessionRecord
	found, err := w.getJSON(ctx, c.Value, &rec)
	if err != nil {
		w.fail(rw, r, http.StatusServiceUnavailable, "sign-out is unavailable right now (session storage); try again shortly", err)
		return
	}
	if found && subtle.ConstantTimeCompare([]byte(r.PostFormValue(CSRFField)), []byte(rec.CSRF)) != 1 {
		w.pages.LoginFailed(rw, r, http.StatusForbidden, "the sign-out form is missing its security token; reload the page and try again")
		return
	}
	if err := w.store.DeleteSession(ctx, c.Value); err != nil {
		w.fail(rw, r, http.StatusServiceUnavailable, "sign-out is unavailable right now (session storage); try again shortly", err)
		return
	}
	http.SetCookie(rw, w.sessionCookie("", -1))
	back := w.cfg.PublicURL + SignedOutPath
	if _, _, err := w.discover(ctx); err == nil && found {
		w.mu.Lock()
		end := w.endURL
		w.mu.Unlock()
		if end != "" {
			if u, err := url.Parse(end); err == nil {
				v := u.Query()
				v.Set("id_token_hint", rec.IDToken)
				v.Set("post_logout_redirect_uri", back)
				v.Set("client_id", w.cfg.ClientID)
				u.RawQuery = v.Encode()
				back = u.String()
			}
		}
	}
	http.Redirect(rw, r, back, http.StatusSeeOther)
}

// fail logs cause (never tokens: go-oidc and oauth2 errors carry none) and
// renders the failure page.
func (w *Web) fail(rw http.ResponseWriter, r *http.Request, status int, reason string, cause error) {
	if cause != nil {
		w.log.WarnContext(r.Context(), "web sign-in failed", "reason", reason, "err", cause)
	} else {
		w.log.InfoContext(r.Context(), "web sign-in refused", "reason", reason)
	}
	w.pages.LoginFailed(rw, r, status, reason)
}

// localPath returns next when it is a path on this site, else "/".
func localPath(next string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.HasPrefix(next, "/auth/") {
		return "/"
	}
	if u, err := url.Parse(next); err != nil || u.Host != "" || u.Scheme != "" {
		return "/"
	}
	return next
}

// describeOAuthError makes an OAuth error code readable; descriptions from
// the issuer are kept short and printable.
func describeOAuthError(code, desc string) string {
	desc = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, desc)
	if len(desc) > 200 {
		desc = desc[:200]
	}
	if desc == "" {
		return code
	}
	return desc + " (" + code + ")"
}

// tokenExpiry is when the session's tokens need a refresh: the ID token's
// expiry (checked against the same clock as everything else here), else
// the access token's (which oauth2 computes from expires_in and time.Now).
func tokenExpiry(tok *oauth2.Token, idt *oidc.IDToken) time.Time {
	if idt != nil && !idt.Expiry.IsZero() {
		return idt.Expiry
	}
	return tok.Expiry
}

// textPages is the default Pages: plain text.
type textPages struct{}

func (textPages) LoginFailed(w http.ResponseWriter, _ *http.Request, status int, reason string) {
	http.Error(w, "Sign-in did not complete: "+reason+"\nStart again at "+LoginPath, status)
}

func (textPages) SignedOut(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("You are signed out. Sign in again at " + LoginPath + "\n"))
}
