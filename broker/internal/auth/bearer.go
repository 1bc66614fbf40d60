package auth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"k8s.io/apimachinery/pkg/util/cache"
)

// Defaults of BearerConfig, and the Bearer's discovery and key intervals.
const (
	DefaultUsernameClaim = "preferred_username"
	DefaultGroupsClaim   = "groups"
	// DefaultRetryInterval is how long a failed discovery is remembered
	// before the next request retries it.
	DefaultRetryInterval = time.Second
	// DefaultDiscoveryTimeout bounds one discovery attempt, JWKS fetch
	// included.
	DefaultDiscoveryTimeout = 5 * time.Second
	// DefaultKeyRefreshMinimum is the least time between two JWKS fetches
	// caused by tokens with unknown keys.
	DefaultKeyRefreshMinimum = 10 * time.Second
)

// maxTokenBytes bounds the bearer tokens Bearer looks at.
const maxTokenBytes = 16 << 10

// Bounds of the cache of verified tokens (Bearer.Authenticate): a token
// that verified is taken again without checking its signature and claims
// for at most verifiedTTL, and never past its own expiry; verifiedTokens
// entries at most, the least recently used dropped first. The API server's
// token authentication cache is the same idea; a client's next request
// (the event stream after a create, a poll) mostly carries the same token,
// and checking it again took about 9 % of a broker replica's CPU in the
// scale rig. A key removed from the issuer's key set stops its cached tokens
// within verifiedTTL.
const (
	verifiedTokens = 4096
	verifiedTTL    = 30 * time.Second
)

// DefaultSigningAlgs returns the algorithms Bearer accepts unless
// WithSigningAlgs says otherwise: RS*, ES* and PS*. "none" and the HMAC
// algorithms never are.
func DefaultSigningAlgs() []string {
	return []string{"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"}
}

// BearerConfig says which tokens Bearer accepts and how it reads them.
type BearerConfig struct {
	// IssuerURL is the OIDC issuer; it must equal the tokens' "iss" claim and
	// the discovery document's issuer. Required; an absolute http(s) URL.
	IssuerURL string
	// Audience must be one of the tokens' "aud" values (the broker's client
	// id). Required.
	Audience string
	// UsernameClaim names the claim that holds the user name; "" means
	// DefaultUsernameClaim. A token without it is refused.
	UsernameClaim string
	// GroupsClaim names the claim that holds the groups, a list of strings
	// or a single string; "" means DefaultGroupsClaim. It may be missing.
	GroupsClaim string
	// AdminGroup is the group whose members are admins; "" means nobody is.
	AdminGroup string
}

// Bearer authenticates "Authorization: Bearer <JWT>" with OIDC discovery and
// go-oidc verification. Create it with NewBearer. Safe for concurrent use.
type Bearer struct {
	cfg    BearerConfig
	client *http.Client
	now    func() time.Time
	algs   []string

	sem chan struct{} // one discovery at a time

	// verified maps the SHA-256 of each token that verified lately to its
	// Principal (see verifiedTTL).
	verified *cache.LRUExpireCache

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier // nil until discovery succeeded
	keys     *keySet
	lastErr  error     // the last discovery failure
	lastTry  time.Time // when it happened
}

var _ Authenticator = (*Bearer)(nil)

// BearerOption configures NewBearer.
type BearerOption func(*Bearer)

// WithHTTPClient sets the client for discovery and JWKS requests. The default
// is a client with a 10 s timeout.
func WithHTTPClient(c *http.Client) BearerOption { return func(b *Bearer) { b.client = c } }

// WithClock sets the clock for expiry checks and retry intervals. The default
// is time.Now.
func WithClock(now func() time.Time) BearerOption { return func(b *Bearer) { b.now = now } }

// WithSigningAlgs sets the accepted JWS algorithms (default
// DefaultSigningAlgs()). "none" and HS* are dropped.
func WithSigningAlgs(algs ...string) BearerOption {
	return func(b *Bearer) {
		b.algs = slices.DeleteFunc(slices.Clone(algs), func(a string) bool {
			return a == "none" || strings.HasPrefix(a, "HS")
		})
	}
}

// NewBearer checks cfg and returns a Bearer. It does no I/O: discovery runs
// on the first Authenticate or Ready (the issuer may start after the broker,
// as the embedded one in dev mode does), is retried after failures, and until
// it succeeds Authenticate returns ErrUnavailable for bearer tokens.
// NewBearer fails only for an invalid cfg; ctx is unused and kept for
// callers that want to bound construction later.
func NewBearer(ctx context.Context, cfg BearerConfig, opts ...BearerOption) (*Bearer, error) {
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = DefaultUsernameClaim
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = DefaultGroupsClaim
	}
	cfg.IssuerURL = strings.TrimSpace(cfg.IssuerURL)
	var errs []error
	if u, err := url.Parse(cfg.IssuerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("issuer URL %q is not an absolute http(s) URL", cfg.IssuerURL))
	}
	if strings.TrimSpace(cfg.Audience) == "" {
		errs = append(errs, errors.New("audience is empty"))
	}
	b := &Bearer{
		cfg:    cfg,
		client: &http.Client{Timeout: 10 * time.Second},
		now:    time.Now,
		algs:   DefaultSigningAlgs(),
		sem:    make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(b)
	}
	b.verified = cache.NewLRUExpireCacheWithClock(verifiedTokens, clockFunc(b.now))
	if len(b.algs) == 0 {
		errs = append(errs, errors.New("no signing algorithm is accepted"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("auth: bearer config: %w", err)
	}
	return b, nil
}

// Ready runs discovery if it has not succeeded yet and reports whether the
// Bearer can verify tokens: nil, or an error matching ErrUnavailable (or a
// context error). For /readyz.
func (b *Bearer) Ready(ctx context.Context) error {
	_, _, err := b.discover(ctx)
	return err
}

// discover returns the verifier and key set, running discovery when needed.
func (b *Bearer) discover(ctx context.Context) (*oidc.IDTokenVerifier, *keySet, error) {
	if v, k := b.loaded(); v != nil {
		return v, k, nil
	}
	select {
	case b.sem <- struct{}{}:
		defer func() { <-b.sem }()
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("%w: wait for discovery: %w", ErrUnavailable, ctx.Err())
	}
	if v, k := b.loaded(); v != nil {
		return v, k, nil
	}
	b.mu.Lock()
	lastErr, lastTry := b.lastErr, b.lastTry
	b.mu.Unlock()
	if lastErr != nil && b.now().Sub(lastTry) < DefaultRetryInterval {
		return nil, nil, lastErr
	}
	v, k, err := b.discoverOnce(ctx)
	if err != nil {
		err = fmt.Errorf("%w: %s: %w", ErrUnavailable, b.cfg.IssuerURL, err)
		if ctx.Err() != nil {
			// The caller gave up; that says nothing about the issuer, so
			// the next caller tries again at once.
			return nil, nil, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.lastErr, b.lastTry = err, b.now()
		return nil, nil, err
	}
	b.verifier, b.keys, b.lastErr = v, k, nil
	return v, k, nil
}

func (b *Bearer) loaded() (*oidc.IDTokenVerifier, *keySet) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.verifier, b.keys
}

func (b *Bearer) discoverOnce(ctx context.Context) (*oidc.IDTokenVerifier, *keySet, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultDiscoveryTimeout)
	defer cancel()
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, b.client), b.cfg.IssuerURL)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: %w", err)
	}
	var meta struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := p.Claims(&meta); err != nil {
		return nil, nil, fmt.Errorf("discovery document: %w", err)
	}
	if meta.JWKSURI == "" {
		return nil, nil, errors.New("discovery document has no jwks_uri")
	}
	algs := make([]jose.SignatureAlgorithm, len(b.algs))
	for i, a := range b.algs {
		algs[i] = jose.SignatureAlgorithm(a)
	}
	ks := newKeySet(meta.JWKSURI, b.client, b.now, algs, DefaultKeyRefreshMinimum)
	if _, err := ks.refresh(ctx); err != nil {
		return nil, nil, err
	}
	v := oidc.NewVerifier(b.cfg.IssuerURL, ks, &oidc.Config{
		ClientID:             b.cfg.Audience,
		SupportedSigningAlgs: b.algs,
		Now:                  b.now,
	})
	return v, ks, nil
}

// Authenticate verifies the request's bearer token and returns its
// Principal. Errors: ErrNoCredentials without an "Authorization: Bearer"
// header; an *Error with a readable reason for a refused token (malformed,
// unsupported algorithm, untrusted issuer, bad signature, other audience,
// expired, missing username claim, malformed groups claim); an error
// matching ErrUnavailable while the issuer cannot be reached.
func (b *Bearer) Authenticate(ctx context.Context, r *http.Request) (Principal, error) {
	raw, err := bearerToken(r)
	if err != nil {
		return Principal{}, err
	}
	key := sha256.Sum256([]byte(raw))
	if p, ok := b.verified.Get(key); ok {
		return p.(Principal).clone(), nil
	}
	hdr, claims, err := peek(raw)
	if err != nil {
		return Principal{}, &Error{Reason: "the bearer token is not a well-formed JWT"}
	}
	if !slices.Contains(b.algs, hdr.Alg) {
		return Principal{}, &Error{Reason: unsupportedAlg(hdr.Alg)}
	}
	if claims.Issuer != b.cfg.IssuerURL {
		return Principal{}, &Error{Reason: "token issuer is not trusted"}
	}
	v, ks, err := b.discover(ctx)
	if err != nil {
		return Principal{}, err
	}
	payload, err := ks.VerifySignature(ctx, raw)
	switch {
	case errors.Is(err, errBadSignature):
		return Principal{}, &Error{Reason: "token signature is invalid"}
	case errors.Is(err, errMalformed):
		return Principal{}, &Error{Reason: "the bearer token is not a well-formed JWT"}
	case err != nil:
		return Principal{}, err
	}
	var verified struct {
		Audience  audience `json:"aud"`
		NotBefore *float64 `json:"nbf"`
	}
	if err := json.Unmarshal(payload, &verified); err != nil {
		return Principal{}, &Error{Reason: "token claims are not valid JSON"}
	}
	if !slices.Contains(verified.Audience, b.cfg.Audience) {
		return Principal{}, &Error{Reason: "token was issued for another audience"}
	}
	// go-oidc checks issuer, audience and expiry and calls the key set
	// again; the context tells it this exact token's signature verified.
	tok, err := v.Verify(withVerified(ctx, raw, payload), raw)
	if err != nil {
		var exp *oidc.TokenExpiredError
		if errors.As(err, &exp) {
			return Principal{}, &Error{Reason: "token expired at " + exp.Expiry.UTC().Format(time.RFC3339)}
		}
		if verified.NotBefore != nil {
			nbf := time.Unix(int64(*verified.NotBefore), 0).UTC()
			return Principal{}, &Error{Reason: "token is not valid before " + nbf.Format(time.RFC3339)}
		}
		return Principal{}, &Error{Reason: "token could not be verified"}
	}
	var all map[string]any
	if err := tok.Claims(&all); err != nil {
		return Principal{}, &Error{Reason: "token claims are not valid JSON"}
	}
	p, err := b.principal(tok.Subject, all)
	if err != nil {
		return Principal{}, err
	}
	if ttl := min(tok.Expiry.Sub(b.now()), verifiedTTL); ttl > 0 {
		b.verified.Add(key, p.clone(), ttl)
	}
	return p, nil
}

// clockFunc adapts a time source to cache.Clock.
type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// principal reads the configured claims.
func (b *Bearer) principal(subject string, claims map[string]any) (Principal, error) {
	user, _ := claims[b.cfg.UsernameClaim].(string)
	if strings.TrimSpace(user) == "" {
		return Principal{}, &Error{Reason: fmt.Sprintf("token has no %q claim with the user name", b.cfg.UsernameClaim)}
	}
	var groups []string
	switch g := claims[b.cfg.GroupsClaim].(type) {
	case nil:
	case string:
		groups = []string{g}
	case []any:
		for _, e := range g {
			s, ok := e.(string)
			if !ok {
				return Principal{}, &Error{Reason: fmt.Sprintf("token claim %q must be a string or a list of strings", b.cfg.GroupsClaim)}
			}
			groups = append(groups, s)
		}
	default:
		return Principal{}, &Error{Reason: fmt.Sprintf("token claim %q must be a string or a list of strings", b.cfg.GroupsClaim)}
	}
	groups = slices.DeleteFunc(groups, func(s string) bool { return s == "" })
	slices.Sort(groups)
	groups = slices.Compact(groups)
	if len(groups) == 0 {
		groups = nil
	}
	return Principal{
		Subject: subject,
		User:    user,
		Groups:  groups,
		Admin:   b.cfg.AdminGroup != "" && slices.Contains(groups, b.cfg.AdminGroup),
	}, nil
}

// bearerToken returns the token of an "Authorization: Bearer" header, or
// ErrNoCredentials.
func bearerToken(r *http.Request) (string, error) {
	scheme, tok, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !strings.EqualFold(scheme, "bearer") {
		return "", ErrNoCredentials
	}
	tok = strings.TrimSpace(tok)
	switch {
	case tok == "":
		return "", &Error{Reason: "the Authorization header has an empty bearer token"}
	case len(tok) > maxTokenBytes:
		return "", &Error{Reason: fmt.Sprintf("the bearer token is larger than %d bytes", maxTokenBytes)}
	}
	return tok, nil
}

type jwtHeader struct {
	Alg string `json:"alg"`
}

type unverifiedClaims struct {
	Issuer string `json:"iss"`
}

// peek decodes a compact JWS's header and claims without verifying them.
func peek(raw string) (jwtHeader, unverifiedClaims, error) {
	var h jwtHeader
	var c unverifiedClaims
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return h, c, errMalformed
	}
	for i, dst := range []any{&h, &c} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			return h, c, errMalformed
		}
		if err := json.Unmarshal(b, dst); err != nil {
			return h, c, errMalformed
		}
	}
	return h, c, nil
}

var shortAlg = regexp.MustCompile(`^[A-Za-z0-9+_-]{1,16}$`)

func unsupportedAlg(alg string) string {
	if !shortAlg.MatchString(alg) {
		return "token uses an unsupported signing algorithm"
	}
	return fmt.Sprintf("token uses an unsupported signing algorithm (%s)", alg)
}

// audience decodes "aud", which is a string or a list of strings.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*a = audience{s}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("aud: %w", err)
	}
	*a = l
	return nil
}
