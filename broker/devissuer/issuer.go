package devissuer

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// DefaultAudience is the audience Mint uses when Claims.Audience is empty. It
// matches the broker's dev-mode audience.
const DefaultAudience = "gpubroker"

// DefaultExpiresIn is the token lifetime Mint uses when Claims.ExpiresIn is 0.
const DefaultExpiresIn = time.Hour

// rsaBits is the size of the generated signing keys.
const rsaBits = 2048

// Paths served by Handler, relative to the issuer URL.
const (
	DiscoveryPath  = "/.well-known/openid-configuration"
	KeysPath       = "/keys"
	AuthorizePath  = "/authorize" // authorization-code flow (see login.go)
	TokenPath      = "/token"     // code and refresh-token grants
	EndSessionPath = "/logout"    // RP-initiated logout
)

// Issuer is an in-process OIDC issuer for dev mode and tests. Create it with
// New or StartTest. It is safe for concurrent use.
type Issuer struct {
	now   func() time.Time
	key   *rsa.PrivateKey
	keyID string

	mu  sync.RWMutex
	url string // "" until known

	otherOnce sync.Once
	otherKey  *rsa.PrivateKey
	otherErr  error

	// login is the authorization-code flow's state (login.go).
	login loginState
}

// Option configures New.
type Option func(*Issuer)

// WithURL sets the issuer URL (the "iss" claim and the base of every
// endpoint), for example "http://127.0.0.1:5556". A trailing slash is
// removed. Without it, Serve or StartTest set the URL from the listener.
func WithURL(u string) Option {
	return func(i *Issuer) { i.url = strings.TrimSuffix(u, "/") }
}

// WithClock sets the clock used for "iat" and "exp". The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(i *Issuer) { i.now = now }
}

// New generates a fresh RSA signing key and returns an issuer that serves
// nothing until Handler is mounted or Serve is called. It fails if the URL
// given with WithURL is not an absolute http(s) URL or key generation fails.
func New(opts ...Option) (*Issuer, error) {
	i := &Issuer{now: time.Now}
	i.login.init()
	for _, o := range opts {
		o(i)
	}
	if i.url != "" && !validURL(i.url) {
		return nil, fmt.Errorf("devissuer: issuer URL %q is not an absolute http(s) URL", i.url)
	}
	key, err := rsa.GenerateKey(rand.Reader, rsaBits)
	if err != nil {
		return nil, fmt.Errorf("devissuer: generate signing key: %w", err)
	}
	i.key = key
	i.keyID = "dev-" + rand.Text()[:12]
	return i, nil
}

// StartTest starts an issuer on an httptest server on 127.0.0.1, sets its
// URL, and closes the server in tb.Cleanup. It fails the test on error.
func StartTest(tb testing.TB, opts ...Option) *Issuer {
	tb.Helper()
	i, err := New(opts...)
	if err != nil {
		tb.Fatalf("devissuer: %v", err)
	}
	srv := httptest.NewServer(i.Handler())
	tb.Cleanup(srv.Close)
	i.setURLIfUnset(srv.URL)
	return i
}

// URL returns the issuer URL, or "" while it is not known yet.
func (i *Issuer) URL() string {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.url
}

func (i *Issuer) setURLIfUnset(u string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.url == "" {
		i.url = strings.TrimSuffix(u, "/")
	}
}

// Serve serves Handler on l until ctx is done, then shuts the server down
// (waiting up to 5 s for open requests) and returns nil. If the issuer URL is
// not set yet, it becomes "http://" + l.Addr(). Serve closes l. It returns
// the server's error if serving fails for another reason.
func (i *Issuer) Serve(ctx context.Context, l net.Listener) error {
	i.setURLIfUnset("http://" + l.Addr().String())
	srv := &http.Server{
		Handler:           i.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("devissuer: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	shutErr := srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("devissuer: serve: %w", err)
	}
	if shutErr != nil {
		return fmt.Errorf("devissuer: shutdown: %w", shutErr)
	}
	return nil
}

// Handler serves the discovery document, the JWKS and the
// authorization-code flow's endpoints (authorize, token, end session).
// Mount it at the root of the issuer URL (or behind http.StripPrefix when
// the URL has a path).
func (i *Issuer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+DiscoveryPath, i.serveDiscovery)
	mux.HandleFunc("GET "+KeysPath, i.serveKeys)
	mux.HandleFunc("GET "+AuthorizePath, i.serveAuthorize)
	mux.HandleFunc("POST "+AuthorizePath, i.serveAuthorize)
	mux.HandleFunc("POST "+TokenPath, i.serveToken)
	mux.HandleFunc("GET "+EndSessionPath, i.serveEndSession)
	return mux
}

// discovery is the subset of OpenID Provider Metadata the issuer publishes.
type discovery struct {
	Issuer                string   `json:"issuer"`
	AuthorizationEndpoint string   `json:"authorization_endpoint"`
	TokenEndpoint         string   `json:"token_endpoint"`
	EndSessionEndpoint    string   `json:"end_session_endpoint"`
	JWKSURI               string   `json:"jwks_uri"`
	ResponseTypes         []string `json:"response_types_supported"`
	SubjectTypes          []string `json:"subject_types_supported"`
	SigningAlgs           []string `json:"id_token_signing_alg_values_supported"`
	Scopes                []string `json:"scopes_supported"`
	Claims                []string `json:"claims_supported"`
	CodeChallengeMethods  []string `json:"code_challenge_methods_supported"`
	GrantTypes            []string `json:"grant_types_supported"`
	TokenAuthMethods      []string `json:"token_endpoint_auth_methods_supported"`
}

func (i *Issuer) serveDiscovery(w http.ResponseWriter, _ *http.Request) {
	u := i.URL()
	if u == "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "issuer URL is not known yet"})
		return
	}
	writeJSON(w, http.StatusOK, discovery{
		Issuer:                u,
		AuthorizationEndpoint: u + AuthorizePath,
		TokenEndpoint:         u + TokenPath,
		EndSessionEndpoint:    u + EndSessionPath,
		JWKSURI:               u + KeysPath,
		ResponseTypes:         []string{"code"},
		SubjectTypes:          []string{"public"},
		SigningAlgs:           []string{string(jose.RS256)},
		Scopes:                []string{"openid", "profile", "email", "groups"},
		Claims:                []string{"iss", "sub", "aud", "exp", "iat", "nonce", "preferred_username", "email", "groups"},
		CodeChallengeMethods:  []string{"S256"},
		GrantTypes:            []string{"authorization_code", "refresh_token"},
		TokenAuthMethods:      []string{"client_secret_basic", "client_secret_post", "none"},
	})
}

func (i *Issuer) serveKeys(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{
		Key:       &i.key.PublicKey,
		KeyID:     i.keyID,
		Algorithm: string(jose.RS256),
		Use:       "sig",
	}}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// An encoding error here means the client went away; nothing to do.
	_ = json.NewEncoder(w).Encode(v)
}

// validURL reports whether u is an absolute http(s) URL.
func validURL(u string) bool {
	p, err := url.Parse(u)
	return err == nil && (p.Scheme == "http" || p.Scheme == "https") && p.Host != ""
}
