package auth_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

const webClient, webSecret = "gpubroker", "client-secret"

// webEnv is a broker-like site (the web login plus two probe routes) on
// httptest, a devissuer with alice (ml) and root (admins), and a real
// redis-server, all on one settable clock.
type webEnv struct {
	clock  *clock
	iss    *devissuer.Issuer
	rdb    *redis.Client
	prefix string
	sites  []*httptest.Server // replicas sharing Redis
	webs   []*auth.Web
}

func startWeb(t *testing.T, replicas int) *webEnv {
	t.Helper()
	e := &webEnv{clock: &clock{t: fixedNow}}
	rs := redistest.Start(t)
	e.rdb, e.prefix = rs.Client(t), rs.Prefix(t)
	issSrv := httptest.NewUnstartedServer(nil)
	var redirects, logouts []string
	for range replicas {
		s := httptest.NewUnstartedServer(nil)
		e.sites = append(e.sites, s)
		redirects = append(redirects, "http://"+s.Listener.Addr().String()+auth.CallbackPath)
		logouts = append(logouts, "http://"+s.Listener.Addr().String()+auth.SignedOutPath)
	}
	iss, err := devissuer.New(devissuer.WithURL("http://"+issSrv.Listener.Addr().String()), devissuer.WithClock(e.clock.Now),
		devissuer.WithUsers(devissuer.User{Username: "alice", Groups: []string{"ml"}}, devissuer.User{Username: "root", Groups: []string{"admins"}}),
		devissuer.WithAutoApprove("alice"),
		devissuer.WithClient(devissuer.Client{ID: webClient, Secret: webSecret, RedirectURIs: redirects, PostLogoutRedirectURIs: logouts}))
	if err != nil {
		t.Fatal(err)
	}
	e.iss = iss
	issSrv.Config.Handler = iss.Handler()
	issSrv.Start()
	t.Cleanup(issSrv.Close)
	for _, s := range e.sites {
		w, err := auth.NewWeb(auth.WebConfig{
			IssuerURL: iss.URL(), ClientID: webClient, ClientSecret: webSecret,
			PublicURL: "http://" + s.Listener.Addr().String(), AdminGroup: "admins",
		}, redisstore.NewSessions(e.rdb, e.prefix), auth.WithWebClock(e.clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		e.webs = append(e.webs, w)
		mux := http.NewServeMux()
		mux.Handle("/auth/", w.Handler())
		mux.HandleFunc("/whoami", func(rw http.ResponseWriter, r *http.Request) {
			s, err := w.Session(r.Context(), r)
			if err != nil {
				http.Error(rw, err.Error(), statusOf(err))
				return
			}
			fmt.Fprintf(rw, "%s %s admin=%t csrf=%s", s.Principal.User, strings.Join(s.Principal.Groups, ","), s.Principal.Admin, s.CSRF)
		})
		mux.HandleFunc("/api", func(rw http.ResponseWriter, r *http.Request) {
			p, err := w.Authenticate(r.Context(), r)
			if err != nil {
				http.Error(rw, err.Error(), statusOf(err))
				return
			}
			fmt.Fprint(rw, p.User)
		})
		s.Config.Handler = mux
		s.Start()
		t.Cleanup(s.Close)
	}
	return e
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, auth.ErrCSRF):
		return http.StatusForbidden
	case errors.Is(err, auth.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, auth.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// browser is a cookie-keeping client that follows redirects one by one, so
// a test can stop or tamper at any hop.
type browser struct {
	t   *testing.T
	jar *cookiejar.Jar
	c   *http.Client
}

func newBrowser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, jar: jar, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	url    string
	status int
	body   string
	resp   *http.Response
}

// do sends one request and reads the answer.
func (b *browser) do(method, u string, form url.Values, header http.Header) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.t.Context(), method, u, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	all, _ := io.ReadAll(resp.Body)
	return page{url: u, status: resp.StatusCode, body: string(all), resp: resp}
}

// follow GETs u and follows redirects until a non-redirect answer, or
// until stop(url) is true for the next hop (then that hop is returned
// unvisited with status 0).
func (b *browser) follow(u string, stop func(*url.URL) bool) page {
	b.t.Helper()
	for range 10 {
		p := b.do(http.MethodGet, u, nil, nil)
		if p.status < 300 || p.status >= 400 {
			return p
		}
		next, err := p.resp.Location()
		if err != nil {
			b.t.Fatal(err)
		}
		u = next.String()
		if stop != nil && stop(next) {
			return page{url: u}
		}
	}
	b.t.Fatalf("too many redirects at %s", u)
	return page{}
}

func (e *webEnv) site(i int) string { return e.sites[i].URL }

// signIn runs a whole sign-in on replica 0 and returns the /whoami body.
func (e *webEnv) signIn(b *browser, query string) page {
	return b.follow(e.site(0)+auth.LoginPath+"?next=/whoami"+query, nil)
}

func TestWebLoginSetsSessionCookie(t *testing.T) {
	e := startWeb(t, 1)
	b := newBrowser(t)
	var sessionCookie *http.Cookie
	p := b.follow(e.site(0)+auth.LoginPath+"?next=/whoami", func(u *url.URL) bool { return u.Path == auth.CallbackPath })
	cb := b.do(http.MethodGet, p.url, nil, nil)
	for _, c := range cb.resp.Cookies() {
		if c.Name == auth.SessionCookie {
			sessionCookie = c
		}
	}
	if sessionCookie == nil {
		t.Fatalf("callback set no session cookie; status %d body %q", cb.status, cb.body)
	}
	if !sessionCookie.HttpOnly || sessionCookie.SameSite != http.SameSiteLaxMode || sessionCookie.Path != "/" || sessionCookie.Secure {
		t.Errorf("session cookie %+v, want HttpOnly, SameSite=Lax, Path=/, not Secure over http", sessionCookie)
	}
	if loc, _ := cb.resp.Location(); loc == nil || loc.Path != "/whoami" {
		t.Errorf("callback redirects to %v, want /whoami", loc)
	}
	who := b.follow(e.site(0)+"/whoami", nil)
	if !strings.HasPrefix(who.body, "alice ml admin=false csrf=") {
		t.Errorf("whoami = %d %q", who.status, who.body)
	}
	// The cookie value is not a key: Redis holds only its digest.
	keys, err := e.rdb.Keys(t.Context(), e.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, sessionCookie.Value) {
			t.Errorf("redis key %q contains the cookie value", k)
		}
	}
}

func TestWebLoginNextAndHint(t *testing.T) {
	e := startWeb(t, 1)
	tests := []struct {
		name, query, wantPath, wantUser string
	}{
		{"local next kept", "?next=/whoami", "/whoami", "alice"},
		{"login hint picks the user", "?next=/whoami&login_hint=root", "/whoami", "root"},
		{"absolute next dropped", "?next=http://evil.example/x", "/", ""},
		{"scheme-relative next dropped", "?next=//evil.example/x", "/", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBrowser(t)
			var last *url.URL
			b.follow(e.site(0)+auth.LoginPath+tc.query, func(u *url.URL) bool {
				last = u
				return u.Host != strings.TrimPrefix(e.iss.URL(), "http://") && u.Path != auth.CallbackPath
			})
			if last == nil || last.Path != tc.wantPath || last.Host != strings.TrimPrefix(e.site(0), "http://") {
				t.Fatalf("sign-in ends at %v, want %s on the site", last, tc.wantPath)
			}
			if tc.wantUser != "" {
				if who := b.follow(e.site(0)+"/whoami", nil); !strings.HasPrefix(who.body, tc.wantUser+" ") {
					t.Errorf("whoami = %q, want %s", who.body, tc.wantUser)
				}
			}
		})
	}
}

// TestWebLoginEdgeCases: every broken sign-in is a 400 with a reason, never
// a 500, and a clean new sign-in works right after.
func TestWebLoginEdgeCases(t *testing.T) {
	e := startWeb(t, 1)
	isIssuer := func(u *url.URL) bool { return "http://"+u.Host == e.iss.URL() && u.Path == devissuer.AuthorizePath }
	isCallback := func(u *url.URL) bool { return u.Path == auth.CallbackPath }
	tests := []struct {
		name       string
		run        func(b *browser) page
		wantReason string
		signedIn   bool // the first, genuine callback signed the browser in
	}{
		{"state mismatch", func(b *browser) page {
			cb := b.follow(e.site(0)+auth.LoginPath, isCallback)
			u, _ := url.Parse(cb.url)
			q := u.Query()
			q.Set("state", "forged")
			u.RawQuery = q.Encode()
			return b.do(http.MethodGet, u.String(), nil, nil)
		}, "state mismatch", false},
		{"callback from another browser", func(b *browser) page {
			cb := b.follow(e.site(0)+auth.LoginPath, isCallback)
			return newBrowser(t).do(http.MethodGet, cb.url, nil, nil)
		}, "state mismatch", false},
		{"replayed callback", func(b *browser) page {
			cb := b.follow(e.site(0)+auth.LoginPath, isCallback)
			if first := b.do(http.MethodGet, cb.url, nil, nil); first.status != http.StatusFound {
				t.Fatalf("first callback: %d %q", first.status, first.body)
			}
			return b.do(http.MethodGet, cb.url, nil, nil)
		}, "state mismatch", true},
		{"replayed code in a fresh sign-in", func(b *browser) page {
			old := b.follow(e.site(0)+auth.LoginPath, isCallback)
			b.do(http.MethodGet, old.url, nil, nil)
			fresh := b.follow(e.site(0)+auth.LoginPath, isCallback)
			ou, _ := url.Parse(old.url)
			fu, _ := url.Parse(fresh.url)
			q := fu.Query()
			q.Set("code", ou.Query().Get("code"))
			fu.RawQuery = q.Encode()
			return b.do(http.MethodGet, fu.String(), nil, nil)
		}, "already used", true},
		{"nonce mismatch", func(b *browser) page {
			authz := b.follow(e.site(0)+auth.LoginPath, isIssuer)
			u, _ := url.Parse(authz.url)
			q := u.Query()
			q.Set("nonce", "someone-elses-nonce")
			u.RawQuery = q.Encode()
			return b.follow(u.String(), nil)
		}, "nonce mismatch", false},
		{"issuer refuses", func(b *browser) page {
			authz := b.follow(e.site(0)+auth.LoginPath, isIssuer)
			u, _ := url.Parse(authz.url)
			q := u.Query()
			q.Del("code_challenge")
			u.RawQuery = q.Encode()
			return b.follow(u.String(), nil)
		}, "PKCE", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBrowser(t)
			got := tc.run(b)
			if got.status != http.StatusBadRequest || !strings.Contains(got.body, tc.wantReason) {
				t.Errorf("answer %d %q, want 400 mentioning %q", got.status, got.body, tc.wantReason)
			}
			if who := b.follow(e.site(0)+"/whoami", nil); !tc.signedIn && who.status != http.StatusUnauthorized {
				t.Errorf("after a failed sign-in whoami = %d %q, want 401", who.status, who.body)
			}
			if p := e.signIn(b, ""); !strings.HasPrefix(p.body, "alice ") {
				t.Errorf("clean sign-in afterwards: %d %q", p.status, p.body)
			}
		})
	}
}

// TestSignInReplacesSession: a second sign-in in the same browser gets a
// new session id, and the old session is gone.
func TestSignInReplacesSession(t *testing.T) {
	e := startWeb(t, 1)
	b := newBrowser(t)
	u, _ := url.Parse(e.site(0))
	var ids []string
	for range 2 {
		if p := e.signIn(b, ""); !strings.HasPrefix(p.body, "alice ") {
			t.Fatalf("sign in: %d %q", p.status, p.body)
		}
		for _, c := range b.jar.Cookies(u) {
			if c.Name == auth.SessionCookie {
				ids = append(ids, c.Value)
			}
		}
	}
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("session ids %v, want two different", ids)
	}
	keys, err := e.rdb.Keys(t.Context(), e.prefix+"*:session").Result()
	if err != nil || len(keys) != 1 {
		t.Errorf("session keys after two sign-ins: %v %v, want one", keys, err)
	}
	old := newBrowser(t)
	old.jar.SetCookies(u, []*http.Cookie{{Name: auth.SessionCookie, Value: ids[0]}})
	if who := old.follow(e.site(0)+"/whoami", nil); who.status != http.StatusUnauthorized {
		t.Errorf("the replaced session still works: %d", who.status)
	}
}

func TestExpiredSessionEndsCleanly(t *testing.T) {
	e := startWeb(t, 1)
	b := newBrowser(t)
	if p := e.signIn(b, ""); !strings.HasPrefix(p.body, "alice ") {
		t.Fatalf("sign in: %d %q", p.status, p.body)
	}
	e.clock.Advance(auth.DefaultSessionTTL)
	who := b.follow(e.site(0)+"/whoami", nil)
	if who.status != http.StatusUnauthorized || !strings.Contains(who.body, "session has ended") {
		t.Errorf("expired session: %d %q, want 401 session has ended", who.status, who.body)
	}
	if p := e.signIn(b, ""); !strings.HasPrefix(p.body, "alice ") {
		t.Errorf("new sign-in: %d %q", p.status, p.body)
	}
}

// TestRefreshOncePerSession: many requests on two replicas find the tokens
// due; the issuer sees exactly one refresh, and everyone gets the groups it
// brought.
func TestRefreshOncePerSession(t *testing.T) {
	e := startWeb(t, 2)
	b := newBrowser(t)
	if p := e.signIn(b, ""); !strings.HasPrefix(p.body, "alice ml admin=false") {
		t.Fatalf("sign in: %d %q", p.status, p.body)
	}
	if err := e.iss.SetGroups("alice", []string{"admins", "ml"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(devissuer.DefaultExpiresIn)
	// The cookie is host-only; copy it to the second replica.
	u0, _ := url.Parse(e.site(0))
	u1, _ := url.Parse(e.site(1))
	b.jar.SetCookies(u1, b.jar.Cookies(u0))

	const n = 16
	var wg sync.WaitGroup
	bodies := make([]string, n)
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, e.site(i%2)+"/whoami", nil)
			resp, err := b.c.Do(req)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			all, _ := io.ReadAll(resp.Body)
			bodies[i] = string(all)
		})
	}
	wg.Wait()
	for i, body := range bodies {
		if !strings.HasPrefix(body, "alice admins,ml admin=true") {
			t.Errorf("request %d: %q, want the refreshed groups", i, body)
		}
	}
	if got := e.iss.Stats().Refreshes; got != 1 {
		t.Errorf("issuer saw %d refreshes, want 1", got)
	}
}

func TestRefreshRefusedEndsSession(t *testing.T) {
	e := startWeb(t, 1)
	b := newBrowser(t)
	if p := e.signIn(b, ""); p.status != http.StatusOK {
		t.Fatalf("sign in: %d %q", p.status, p.body)
	}
	// The user logs out at the issuer elsewhere: the refresh token dies.
	end := b.follow(e.iss.URL()+devissuer.EndSessionPath+"?"+url.Values{"id_token_hint": {mintHint(t, e)}}.Encode(), nil)
	if end.status != http.StatusOK {
		t.Fatalf("end session at issuer: %d", end.status)
	}
	e.clock.Advance(devissuer.DefaultExpiresIn)
	who := b.follow(e.site(0)+"/whoami", nil)
	if who.status != http.StatusUnauthorized {
		t.Errorf("whoami after refused refresh: %d %q, want 401", who.status, who.body)
	}
}

// mintHint makes an ID token hint naming alice for the broker's client.
func mintHint(t *testing.T, e *webEnv) string {
	t.Helper()
	tok, err := e.iss.Mint(devissuer.Claims{Subject: "sub-alice", Audience: webClient})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func csrfOf(body string) string {
	_, after, _ := strings.Cut(body, "csrf=")
	return after
}

func TestLogoutNeedsCSRFAndClearsSession(t *testing.T) {
	e := startWeb(t, 1)
	b := newBrowser(t)
	p := e.signIn(b, "")
	token := csrfOf(p.body)
	if got := b.do(http.MethodPost, e.site(0)+auth.LogoutPath, url.Values{}, nil); got.status != http.StatusForbidden {
		t.Errorf("logout without CSRF: %d %q, want 403", got.status, got.body)
	}
	if who := b.follow(e.site(0)+"/whoami", nil); who.status != http.StatusOK {
		t.Fatalf("session gone after a refused logout: %d", who.status)
	}
	out := b.do(http.MethodPost, e.site(0)+auth.LogoutPath, url.Values{auth.CSRFField: {token}}, nil)
	loc, err := out.resp.Location()
	if err != nil || "http://"+loc.Host != e.iss.URL() || loc.Path != devissuer.EndSessionPath {
		t.Fatalf("logout redirects to %v (%v), want the issuer's end-session endpoint", loc, err)
	}
	final := b.follow(loc.String(), nil)
	if !strings.Contains(final.body, "signed out") || final.status != http.StatusOK {
		t.Errorf("after logout: %d %q, want the signed-out page", final.status, final.body)
	}
	if who := b.follow(e.site(0)+"/whoami", nil); who.status != http.StatusUnauthorized {
		t.Errorf("whoami after logout: %d, want 401", who.status)
	}
	if n, err := e.rdb.Keys(t.Context(), e.prefix+"*:session").Result(); err != nil || len(n) != 0 {
		t.Errorf("session keys after logout: %v %v", n, err)
	}
	if got := e.iss.Stats().Logouts; got != 1 {
		t.Errorf("issuer logouts %d, want 1", got)
	}
}

func TestAuthenticateNeedsCSRFOnUnsafeMethods(t *testing.T) {
	e := startWeb(t, 1)
	b := newBrowser(t)
	token := csrfOf(e.signIn(b, "").body)
	tests := []struct {
		name       string
		method     string
		header     http.Header
		cookieless bool
		want       int
	}{
		{"GET needs no token", http.MethodGet, nil, false, http.StatusOK},
		{"PUT without token", http.MethodPut, nil, false, http.StatusForbidden},
		{"DELETE with a wrong token", http.MethodDelete, http.Header{auth.CSRFHeader: {"nope"}}, false, http.StatusForbidden},
		{"PUT with the token", http.MethodPut, http.Header{auth.CSRFHeader: {token}}, false, http.StatusOK},
		{"no cookie", http.MethodGet, nil, true, http.StatusUnauthorized},
	}
	var got, want []string
	for _, tc := range tests {
		c := b
		if tc.cookieless {
			c = newBrowser(t)
		}
		p := c.do(tc.method, e.site(0)+"/api", nil, tc.header)
		got = append(got, fmt.Sprintf("%s: %d", tc.name, p.status))
		want = append(want, fmt.Sprintf("%s: %d", tc.name, tc.want))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestNewWebRefusesBadConfig(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, cfg := range []auth.WebConfig{
		{ClientID: "c", PublicURL: "http://x"},
		{IssuerURL: "http://i", PublicURL: "http://x"},
		{IssuerURL: "http://i", ClientID: "c", PublicURL: "x"},
	} {
		if _, err := auth.NewWeb(cfg, redisstore.NewSessions(rdb, "p:")); err == nil {
			t.Errorf("NewWeb(%+v) succeeded", cfg)
		}
	}
}
