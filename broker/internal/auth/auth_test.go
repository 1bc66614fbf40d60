package auth_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var fixedNow = time.Date(2026, 11, 29, 15, 4, 5, 0, time.UTC)

// clock is a settable clock shared by the issuer and the Bearer.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// idp is a devissuer behind a switch that can make discovery or the JWKS
// answer 503, counting the requests it gets.
type idp struct {
	iss         *devissuer.Issuer
	srv         *httptest.Server
	clock       *clock
	down        atomic.Bool // everything answers 503
	keysDown    atomic.Bool // only the JWKS answers 503
	discoveries atomic.Int32
	keyFetches  atomic.Int32
}

func startIdP(t *testing.T) *idp {
	t.Helper()
	f := &idp{clock: &clock{t: fixedNow}}
	var h http.Handler
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case devissuer.DiscoveryPath:
			f.discoveries.Add(1)
		case devissuer.KeysPath:
			f.keyFetches.Add(1)
			if f.keysDown.Load() {
				http.Error(w, "keys unavailable", http.StatusServiceUnavailable)
				return
			}
		}
		if f.down.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	iss, err := devissuer.New(devissuer.WithURL("http://"+f.srv.Listener.Addr().String()), devissuer.WithClock(f.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	f.iss, h = iss, iss.Handler()
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *idp) bearer(t *testing.T, cfg auth.BearerConfig, opts ...auth.BearerOption) *auth.Bearer {
	t.Helper()
	if cfg.IssuerURL == "" {
		cfg.IssuerURL = f.iss.URL()
	}
	if cfg.Audience == "" {
		cfg.Audience = "broker"
	}
	opts = append([]auth.BearerOption{auth.WithHTTPClient(f.srv.Client()), auth.WithClock(f.clock.Now)}, opts...)
	b, err := auth.NewBearer(t.Context(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *idp) mint(t *testing.T, c devissuer.Claims, opts ...devissuer.MintOption) string {
	t.Helper()
	if c.Audience == "" {
		c.Audience = "broker"
	}
	tok, err := f.iss.Mint(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func request(authz string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/api/v1/servers", nil)
	if authz != "" {
		r.Header.Set("Authorization", authz)
	}
	return r
}

// reason returns the *Error reason of err, or fails.
func reason(t *testing.T, err error) string {
	t.Helper()
	var e *auth.Error
	if !errors.As(err, &e) || !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("error %v (%T) is not an *auth.Error matching ErrUnauthenticated", err, err)
	}
	return e.Reason
}

func hs256Token() string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
		enc.EncodeToString([]byte(`{"sub":"s"}`)) + "." + enc.EncodeToString([]byte("mac"))
}

func TestBearerTokenMatrix(t *testing.T) {
	f := startIdP(t)
	b := f.bearer(t, auth.BearerConfig{AdminGroup: "gpubroker-admins"})
	alice := devissuer.Claims{Subject: "sub-alice", Username: "alice", Groups: []string{"ml", "gpubroker-admins", "ml"}}
	tests := []struct {
		name       string
		authz      string
		want       auth.Principal
		wantReason string
	}{
		{
			name:  "valid token gives user, sorted groups and admin",
			authz: "Bearer " + f.mint(t, alice),
			want:  auth.Principal{Subject: "sub-alice", User: "alice", Groups: []string{"gpubroker-admins", "ml"}, Admin: true},
		},
		{
			name:  "scheme is case-insensitive and non-admins are not admins",
			authz: "bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "bob", Groups: []string{"ml"}}),
			want:  auth.Principal{Subject: "s", User: "bob", Groups: []string{"ml"}},
		},
		{
			name:  "groups claim may be a single string",
			authz: "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "bob", Extra: map[string]any{"groups": "gpubroker-admins"}}),
			want:  auth.Principal{Subject: "s", User: "bob", Groups: []string{"gpubroker-admins"}, Admin: true},
		},
		{
			name:  "audience may be a list",
			authz: "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "bob", Extra: map[string]any{"aud": []string{"other", "broker"}}}),
			want:  auth.Principal{Subject: "s", User: "bob"},
		},
		{
			name:       "expired",
			authz:      "Bearer " + f.mint(t, alice, devissuer.Expired()),
			wantReason: "token expired at 2026-11-29T15:03:05Z",
		},
		{
			name:       "not valid yet",
			authz:      "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "u", Extra: map[string]any{"nbf": fixedNow.Add(time.Hour).Unix()}}),
			wantReason: "token is not valid before 2026-11-29T16:04:05Z",
		},
		{
			name:       "wrong audience",
			authz:      "Bearer " + f.mint(t, alice, devissuer.WithAudience("someone-else")),
			wantReason: "token was issued for another audience",
		},
		{
			name:       "wrong issuer",
			authz:      "Bearer " + f.mint(t, alice, devissuer.WithIssuer("https://evil.example")),
			wantReason: "token issuer is not trusted",
		},
		{
			name:       "bad signature",
			authz:      "Bearer " + f.mint(t, alice, devissuer.SignedByOtherKey()),
			wantReason: "token signature is invalid",
		},
		{
			name:       "alg none",
			authz:      "Bearer " + f.mint(t, alice, devissuer.AlgNone()),
			wantReason: "token uses an unsupported signing algorithm (none)",
		},
		{
			name:       "HMAC algorithm",
			authz:      "Bearer " + hs256Token(),
			wantReason: "token uses an unsupported signing algorithm (HS256)",
		},
		{
			name:       "not a JWT",
			authz:      "Bearer not-a-jwt",
			wantReason: "the bearer token is not a well-formed JWT",
		},
		{
			name:       "empty bearer token",
			authz:      "Bearer ",
			wantReason: "the Authorization header has an empty bearer token",
		},
		{
			name:       "missing username claim",
			authz:      "Bearer " + f.mint(t, devissuer.Claims{Subject: "s"}),
			wantReason: `token has no "preferred_username" claim with the user name`,
		},
		{
			name:       "groups claim of numbers",
			authz:      "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "bob", Extra: map[string]any{"groups": []int{1}}}),
			wantReason: `token claim "groups" must be a string or a list of strings`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.Authenticate(t.Context(), request(tc.authz))
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("Authenticate: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("principal (-want +got):\n%s", diff)
				}
				return
			}
			if diff := cmp.Diff(tc.wantReason, reason(t, err)); diff != "" {
				t.Errorf("reason (-want +got):\n%s", diff)
			}
			if tok := strings.TrimPrefix(tc.authz, "Bearer "); len(tok) > 8 && strings.Contains(err.Error(), tok) {
				t.Errorf("error %q echoes the token", err)
			}
		})
	}
}

func TestBearerWithoutBearerCredentials(t *testing.T) {
	f := startIdP(t)
	b := f.bearer(t, auth.BearerConfig{})
	for _, authz := range []string{"", "Basic YWxpY2U6cHc=", "token abc"} {
		_, err := b.Authenticate(t.Context(), request(authz))
		if !errors.Is(err, auth.ErrNoCredentials) {
			t.Errorf("Authorization %q: error %v, want ErrNoCredentials", authz, err)
		}
	}
}

func TestBearerCustomClaims(t *testing.T) {
	f := startIdP(t)
	b := f.bearer(t, auth.BearerConfig{UsernameClaim: "email", GroupsClaim: "roles", AdminGroup: "root"})
	tok := f.mint(t, devissuer.Claims{
		Subject: "s", Username: "ignored", Email: "carol@example.com", Groups: []string{"ignored"},
		Extra: map[string]any{"roles": []string{"root", "dev"}},
	})
	got, err := b.Authenticate(t.Context(), request("Bearer "+tok))
	if err != nil {
		t.Fatal(err)
	}
	want := auth.Principal{Subject: "s", User: "carol@example.com", Groups: []string{"dev", "root"}, Admin: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("principal (-want +got):\n%s", diff)
	}
	_, err = b.Authenticate(t.Context(), request("Bearer "+f.mint(t, devissuer.Claims{Subject: "s", Username: "u"})))
	if diff := cmp.Diff(`token has no "email" claim with the user name`, reason(t, err)); diff != "" {
		t.Errorf("reason (-want +got):\n%s", diff)
	}
}

func TestBearerLazyDiscovery(t *testing.T) {
	f := startIdP(t)
	f.down.Store(true)
	b := f.bearer(t, auth.BearerConfig{})
	if n := f.discoveries.Load(); n != 0 {
		t.Fatalf("NewBearer made %d discovery requests, want none (discovery is lazy)", n)
	}
	tok := "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "u"})

	_, err := b.Authenticate(t.Context(), request(tok))
	if !errors.Is(err, auth.ErrUnavailable) || errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("while the issuer is down: error %v, want ErrUnavailable only", err)
	}
	if n := f.discoveries.Load(); n != 1 {
		t.Errorf("the first use made %d discovery requests, want 1", n)
	}
	_, _ = b.Authenticate(t.Context(), request(tok))
	if n := f.discoveries.Load(); n != 1 {
		t.Errorf("within the retry interval: %d discovery requests, want still 1", n)
	}
	f.down.Store(false)
	if err := b.Ready(t.Context()); !errors.Is(err, auth.ErrUnavailable) {
		t.Errorf("Ready within the retry interval = %v, want the remembered ErrUnavailable", err)
	}
	f.clock.Advance(auth.DefaultRetryInterval)
	if err := b.Ready(t.Context()); err != nil {
		t.Fatalf("Ready after the retry interval: %v", err)
	}
	if _, err := b.Authenticate(t.Context(), request(tok)); err != nil {
		t.Fatalf("Authenticate after discovery: %v", err)
	}
	f.down.Store(true) // discovery is cached for good
	if _, err := b.Authenticate(t.Context(), request(tok)); err != nil {
		t.Errorf("Authenticate with cached discovery and keys: %v", err)
	}
	if n := f.discoveries.Load(); n != 2 {
		t.Errorf("%d discovery requests in all, want 2", n)
	}
}

func TestBearerDiscoveryIsSingleFlight(t *testing.T) {
	f := startIdP(t)
	f.down.Store(true)
	b := f.bearer(t, auth.BearerConfig{})
	f.down.Store(false)
	f.clock.Advance(auth.DefaultRetryInterval)
	before := f.discoveries.Load()
	tok := "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "u"})

	const callers = 16
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			_, err := b.Authenticate(t.Context(), request(tok))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Authenticate: %v", err)
		}
	}
	if n := f.discoveries.Load() - before; n != 1 {
		t.Errorf("%d concurrent callers made %d discovery requests, want 1", callers, n)
	}
}

func TestBearerKeyFetch(t *testing.T) {
	f := startIdP(t)
	b := f.bearer(t, auth.BearerConfig{})
	if err := b.Ready(t.Context()); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	forged := "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "u"}, devissuer.SignedByOtherKey())
	fetches := f.keyFetches.Load()

	_, err := b.Authenticate(t.Context(), request(forged))
	if diff := cmp.Diff("token signature is invalid", reason(t, err)); diff != "" {
		t.Errorf("reason (-want +got):\n%s", diff)
	}
	if n := f.keyFetches.Load() - fetches; n != 0 {
		t.Errorf("a forged token within the refresh minimum caused %d key fetches, want 0", n)
	}

	f.keysDown.Store(true)
	f.clock.Advance(auth.DefaultKeyRefreshMinimum)
	_, err = b.Authenticate(t.Context(), request(forged))
	if !errors.Is(err, auth.ErrUnavailable) {
		t.Errorf("JWKS down: error %v, want ErrUnavailable", err)
	}
	if n := f.keyFetches.Load() - fetches; n != 1 {
		t.Errorf("after the refresh minimum: %d key fetches, want 1", n)
	}
	valid := "Bearer " + f.mint(t, devissuer.Claims{Subject: "s", Username: "u"})
	if _, err := b.Authenticate(t.Context(), request(valid)); err != nil {
		t.Errorf("a token with a cached key while the JWKS is down: %v", err)
	}
}

func TestBearerTakesAVerifiedTokenAgainOnlyAsItIsAndWhileItLasts(t *testing.T) {
	f := startIdP(t)
	b := f.bearer(t, auth.BearerConfig{})
	tok := f.mint(t, devissuer.Claims{Subject: "s", Username: "alice", Groups: []string{"ml"}, ExpiresIn: 10 * time.Second})
	first, err := b.Authenticate(t.Context(), request("Bearer "+tok))
	if err != nil {
		t.Fatal(err)
	}
	first.Groups[0] = "changed by the caller"
	again, err := b.Authenticate(t.Context(), request("Bearer "+tok))
	want := auth.Principal{Subject: "s", User: "alice", Groups: []string{"ml"}}
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, again); diff != "" {
		t.Errorf("the same token again (-want +got):\n%s", diff)
	}
	// A token that differs in one byte of its signature is checked anew.
	sig := tok[strings.LastIndex(tok, ".")+1:]
	flipped := "A"
	if sig[0] == 'A' {
		flipped = "B"
	}
	tampered := tok[:strings.LastIndex(tok, ".")+1] + flipped + sig[1:]
	if _, err := b.Authenticate(t.Context(), request("Bearer "+tampered)); err == nil {
		t.Errorf("a token with a changed signature was taken for the verified one")
	}
	// A verified token is never taken past its own expiry.
	f.clock.Advance(11 * time.Second)
	_, err = b.Authenticate(t.Context(), request("Bearer "+tok))
	if got := reason(t, err); !strings.HasPrefix(got, "token expired at ") {
		t.Errorf("the token after its expiry: %q, want it refused as expired", got)
	}
}

func TestNewBearerReportsEveryProblem(t *testing.T) {
	_, err := auth.NewBearer(t.Context(), auth.BearerConfig{IssuerURL: "ftp://x"}, auth.WithSigningAlgs("none", "HS256"))
	if err == nil {
		t.Fatal("NewBearer succeeded, want an error")
	}
	for _, want := range []string{`issuer URL "ftp://x" is not an absolute http(s) URL`, "audience is empty", "no signing algorithm is accepted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestHubToken(t *testing.T) {
	hubP := auth.Principal{User: auth.HubUser, Hub: true}
	tests := []struct {
		name       string
		token      string
		authz      string
		want       auth.Principal
		wantNoCred bool
		wantReason string
	}{
		{name: "token scheme", token: "s3cret", authz: "token s3cret", want: hubP},
		{name: "bearer scheme", token: "s3cret", authz: "Bearer s3cret", want: hubP},
		{name: "wrong token under token scheme is refused", token: "s3cret", authz: "token nope", wantReason: "the JupyterHub service token is not valid"},
		{name: "prefix of the token is refused", token: "s3cret", authz: "token s3cre", wantReason: "the JupyterHub service token is not valid"},
		{name: "other bearer token falls through", token: "s3cret", authz: "Bearer eyJ.x.y", wantNoCred: true},
		{name: "no header falls through", token: "s3cret", wantNoCred: true},
		{name: "disabled hub token accepts nothing", token: "", authz: "token ", wantNoCred: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := auth.NewHubToken(tc.token).Authenticate(t.Context(), request(tc.authz))
			switch {
			case tc.wantNoCred:
				if !errors.Is(err, auth.ErrNoCredentials) {
					t.Errorf("error %v, want ErrNoCredentials", err)
				}
			case tc.wantReason != "":
				if diff := cmp.Diff(tc.wantReason, reason(t, err)); diff != "" {
					t.Errorf("reason (-want +got):\n%s", diff)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("principal (-want +got):\n%s", diff)
				}
			}
		})
	}
}

type authFunc func(context.Context, *http.Request) (auth.Principal, error)

func (f authFunc) Authenticate(ctx context.Context, r *http.Request) (auth.Principal, error) {
	return f(ctx, r)
}

func TestChain(t *testing.T) {
	f := startIdP(t)
	c := auth.Chain(auth.NewHubToken("hub-secret"), f.bearer(t, auth.BearerConfig{}))
	jwt := f.mint(t, devissuer.Claims{Subject: "s", Username: "dave"})
	tests := []struct {
		name       string
		authz      string
		wantUser   string
		wantNoCred bool
		wantReason string
	}{
		{name: "hub token as bearer", authz: "Bearer hub-secret", wantUser: auth.HubUser},
		{name: "user token falls through to the bearer", authz: "Bearer " + jwt, wantUser: "dave"},
		{name: "wrong hub token stops the chain", authz: "token x", wantReason: "the JupyterHub service token is not valid"},
		{name: "nothing", wantNoCred: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.Authenticate(t.Context(), request(tc.authz))
			switch {
			case tc.wantNoCred:
				if !errors.Is(err, auth.ErrNoCredentials) || !errors.Is(err, auth.ErrUnauthenticated) {
					t.Errorf("error %v, want ErrNoCredentials matching ErrUnauthenticated", err)
				}
			case tc.wantReason != "":
				if diff := cmp.Diff(tc.wantReason, reason(t, err)); diff != "" {
					t.Errorf("reason (-want +got):\n%s", diff)
				}
			default:
				if err != nil || p.User != tc.wantUser {
					t.Errorf("got %+v, %v; want user %q", p, err, tc.wantUser)
				}
			}
		})
	}

	boom := errors.New("boom")
	called := false
	stop := auth.Chain(
		authFunc(func(context.Context, *http.Request) (auth.Principal, error) { return auth.Principal{}, boom }),
		authFunc(func(context.Context, *http.Request) (auth.Principal, error) {
			called = true
			return auth.Principal{}, nil
		}),
	)
	if _, err := stop.Authenticate(t.Context(), request("")); !errors.Is(err, boom) || called {
		t.Errorf("chain after a failure: err %v, later called %v; want boom and not called", err, called)
	}
	if _, err := auth.Chain().Authenticate(t.Context(), request("")); !errors.Is(err, auth.ErrNoCredentials) {
		t.Errorf("empty chain: %v, want ErrNoCredentials", err)
	}
}

func TestPrincipalContextAndLog(t *testing.T) {
	p := auth.Principal{Subject: "secret-sub", User: "erin", Groups: []string{"secret-group"}, Admin: true}
	if _, ok := auth.FromContext(t.Context()); ok {
		t.Error("empty context carries a principal")
	}
	got, ok := auth.FromContext(auth.WithPrincipal(t.Context(), p))
	if !ok {
		t.Fatal("no principal in context")
	}
	if diff := cmp.Diff(p, got); diff != "" {
		t.Errorf("principal (-want +got):\n%s", diff)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "user", p)
	if !strings.Contains(buf.String(), `"user":"erin"`) || strings.Contains(buf.String(), "secret") {
		t.Errorf("log line %s, want user erin and no subject or groups", buf.String())
	}
}

func TestCanActFor(t *testing.T) {
	tests := []struct {
		name string
		p    auth.Principal
		user string
		want bool
	}{
		{"own servers", auth.Principal{User: "alice"}, "alice", true},
		{"another user's servers", auth.Principal{User: "alice"}, "bob", false},
		{"admin", auth.Principal{User: "root", Admin: true}, "bob", true},
		{"hub", auth.Principal{User: auth.HubUser, Hub: true}, "bob", true},
		{"empty principal", auth.Principal{}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.CanActFor(tc.user); got != tc.want {
				t.Errorf("CanActFor(%q) = %v, want %v", tc.user, got, tc.want)
			}
		})
	}
}

// BenchmarkBearerAuthenticate measures one verification of a valid RS256
// token with discovery and keys cached: the per-request cost of bearer auth.
func BenchmarkBearerAuthenticate(b *testing.B) {
	iss := devissuer.StartTest(b)
	bearer, err := auth.NewBearer(b.Context(), auth.BearerConfig{IssuerURL: iss.URL(), Audience: "broker"})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := iss.Mint(devissuer.Claims{Subject: "s", Username: "u", Groups: []string{"a", "b"}, Audience: "broker"})
	if err != nil {
		b.Fatal(err)
	}
	r := request("Bearer " + tok)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bearer.Authenticate(b.Context(), r); err != nil {
			b.Fatal(err)
		}
	}
}
