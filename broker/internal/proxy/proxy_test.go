package proxy_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/websocket"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/proxy"
	"github.com/gpubroker/gpubroker/spawner"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// seen is what the stand-in notebook reports about a request.
type seen struct {
	Host          string            `json:"host"`
	Path          string            `json:"path"`
	Authorization string            `json:"authorization"`
	Cookies       map[string]string `json:"cookies"`
	Forwarded     string            `json:"forwarded"`
}

// notebook is a stand-in Jupyter server: it echoes what it got, sets
// cookies, streams, and echoes WebSocket messages.
func notebook(t *testing.T, release <-chan struct{}) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/user/ada/nb/echo", func(w http.ResponseWriter, r *http.Request) {
		// The digest of the credential: the token itself would be taken
		// out of the answer by the proxy.
		s := seen{Host: r.Host, Path: r.URL.Path, Authorization: sha256Hex(r.Header.Get("Authorization")), Cookies: map[string]string{},
			Forwarded: r.Header.Get("X-Forwarded-Host")}
		for _, c := range r.Cookies() {
			s.Cookies[c.Name] = c.Value
		}
		_ = json.NewEncoder(w).Encode(s)
	})
	mux.HandleFunc("/user/ada/nb/setcookie", func(w http.ResponseWriter, _ *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: auth.SessionCookie, Value: "fixed-by-the-notebook", Path: "/"})
		http.SetCookie(w, &http.Cookie{Name: "_xsrf", Value: "notebook-xsrf", Path: "/user/ada/nb/"})
		w.Header().Set("Service-Worker-Allowed", "/")
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("/user/ada/nb/page", func(w http.ResponseWriter, r *http.Request) {
		// Jupyter renders its token into its pages; here split across two
		// flushed writes, so the proxy must catch it across reads.
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "token ")
		w.Header().Set("Content-Type", "text/html; charset=UTF-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(tok)+60))
		half := len(tok) / 2
		io.WriteString(w, `<body data-jupyter-api-token="`+tok[:half])
		w.(http.Flusher).Flush()
		io.WriteString(w, tok[half:]+`">`+strings.Repeat(" ", 60-len(`<body data-jupyter-api-token="`)-len(`">`)))
	})
	mux.HandleFunc("/user/ada/nb/stream", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "second\n")
	})
	mux.Handle("/user/ada/nb/ws", websocket.Server{
		Handshake: func(*websocket.Config, *http.Request) error { return nil },
		Handler:   func(c *websocket.Conn) { _, _ = io.Copy(c, c) },
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// fixture is a proxy in front of a stand-in notebook, with its fakes.
type fixture struct {
	t       *testing.T
	p       *proxy.Proxy
	srv     *httptest.Server // the broker
	nb      *httptest.Server
	servers *fakeServers
	auth    *fakeAuth
	tokens  *fakeTokens
	act     *fakeActivity
	metrics *fakeMetrics
	release chan struct{}
}

// fakeMetrics counts the proxied requests in flight.
type fakeMetrics struct{ n atomic.Int64 }

func (m *fakeMetrics) ProxyOpened() { m.n.Add(1) }
func (m *fakeMetrics) ProxyClosed() { m.n.Add(-1) }

const domain = "nb.test"

func newFixture(t *testing.T, mode proxy.Mode, admins bool) *fixture {
	t.Helper()
	f := &fixture{t: t, servers: &fakeServers{}, tokens: &fakeTokens{}, release: make(chan struct{}),
		auth: &fakeAuth{sessions: map[string]auth.Session{}, bearers: map[string]auth.Principal{}},
		act:  &fakeActivity{got: map[string]fleet.ProxyActivity{}}, metrics: &fakeMetrics{}}
	f.nb = notebook(t, f.release)
	f.srv = httptest.NewUnstartedServer(nil)
	var err error
	f.p, err = proxy.New(proxy.Config{
		Mode: mode, PublicURL: "http://" + f.srv.Listener.Addr().String(), Domain: domain, AdminAccess: admins,
		SessionCheck: time.Nanosecond, ActivityFlush: 10 * time.Millisecond,
	}, proxy.Deps{
		Servers: f.servers, Pods: fakePods{f.servers}, Tokens: f.tokens, Sessions: f.auth, Bearer: f.auth,
		Handoffs: &fakeHandoffs{auth: f.auth, codes: map[string][]byte{}, hosts: map[string][]byte{}},
		Activity: f.act, Pages: fakePages{}, Metrics: f.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Config.Handler = f.p.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "broker page")
	}))
	f.srv.Start()
	t.Cleanup(func() {
		select {
		case <-f.release:
		default:
			close(f.release)
		}
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	f.servers.put(fleet.Server{ServerKey: fleet.ServerKey{User: "ada", Name: "nb"}, SpawnID: "sp1", State: v1.StateRunning, URL: f.nb.URL})
	f.servers.put(fleet.Server{ServerKey: fleet.ServerKey{User: "ada", Name: "old"}, SpawnID: "sp0", State: v1.StateStopped})
	f.servers.put(fleet.Server{ServerKey: fleet.ServerKey{User: "bob", Name: "nb"}, SpawnID: "sp2", State: v1.StateRunning, URL: f.nb.URL})
	f.auth.addSession("ada-cookie", auth.Principal{User: "ada"})
	f.auth.addSession("bob-cookie", auth.Principal{User: "bob"})
	f.auth.addSession("root-cookie", auth.Principal{User: "root", Admin: true})
	f.auth.bearers["ada-jwt"] = auth.Principal{User: "ada"}
	f.auth.bearers["bob-jwt"] = auth.Principal{User: "bob"}
	f.auth.bearers["hub"] = auth.Principal{User: "hub", Hub: true}
	return f
}

// client is a browser without redirects followed.
func (f *fixture) client(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			// Every host (the broker's, *.nb.test) is the broker.
			return (&net.Dialer{}).DialContext(ctx, network, f.srv.Listener.Addr().String())
		}}}
}

type req struct {
	method, url, cookie, bearer, origin, accept string
}

func (f *fixture) do(r req) (*http.Response, string) {
	f.t.Helper()
	if r.method == "" {
		r.method = http.MethodGet
	}
	if !strings.HasPrefix(r.url, "http") {
		r.url = f.srv.URL + r.url
	}
	hr, err := http.NewRequest(r.method, r.url, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if r.cookie != "" {
		hr.Header.Set("Cookie", r.cookie)
	}
	if r.bearer != "" {
		hr.Header.Set("Authorization", "Bearer "+r.bearer)
	}
	if r.origin != "" {
		hr.Header.Set("Origin", r.origin)
	}
	if r.accept != "" {
		hr.Header.Set("Accept", r.accept)
	}
	c := f.client(nil)
	defer c.CloseIdleConnections()
	resp, err := c.Do(hr)
	if err != nil {
		f.t.Fatalf("%s %s: %v", r.method, r.url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const html = "text/html,application/xhtml+xml"

// TestPathModeForwardsToTheOwnerOnly checks who passes in path mode and
// what everyone else gets.
func TestPathModeForwardsToTheOwnerOnly(t *testing.T) {
	f := newFixture(t, proxy.ModePath, false)
	tests := []struct {
		name   string
		r      req
		status int
		want   string // in the body or the Location
	}{
		{"the owner's session", req{url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=ada-cookie"}, 200, `"path":"/user/ada/nb/echo"`},
		{"the owner's bearer token", req{url: "/user/ada/nb/echo", bearer: "ada-jwt"}, 200, `"path":"/user/ada/nb/echo"`},
		{"another user's session", req{url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=bob-cookie"}, 404, "not_found"},
		{"another user's bearer token", req{url: "/user/ada/nb/echo", bearer: "bob-jwt"}, 404, "not_found"},
		{"the hub's token", req{url: "/user/ada/nb/echo", bearer: "hub"}, 404, "not_found"},
		{"an admin without admin access", req{url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=root-cookie"}, 404, "not_found"},
		{"another user's page", req{url: "/user/ada/nb/tree", cookie: auth.SessionCookie + "=bob-cookie", accept: html}, 404, "error page"},
		{"no credentials, a browser", req{url: "/user/ada/nb/tree?x=1", accept: html}, 303, "/auth/login?next=%2Fuser%2Fada%2Fnb%2Ftree%3Fx%3D1"},
		{"no credentials, a script", req{url: "/user/ada/nb/api/kernels"}, 401, "unauthenticated"},
		{"a refused bearer token", req{url: "/user/ada/nb/echo", bearer: "forged"}, 401, "token signature is invalid"},
		{"an ended session, a browser", req{url: "/user/ada/nb/tree", cookie: auth.SessionCookie + "=gone", accept: html}, 303, "/auth/login"},
		{"an unknown server", req{url: "/user/ada/nope/tree", cookie: auth.SessionCookie + "=ada-cookie", accept: html}, 404, "error page"},
		{"not a slug", req{url: "/user/Ada/nb/tree", cookie: auth.SessionCookie + "=ada-cookie"}, 404, "not_found"},
		{"a stopped server, a browser", req{url: "/user/ada/old/tree", cookie: auth.SessionCookie + "=ada-cookie", accept: html}, 200, "notebook page for ada/old"},
		{"a stopped server, a script", req{url: "/user/ada/old/api/kernels", cookie: auth.SessionCookie + "=ada-cookie"}, 503, "not_running"},
		{"the base URL without its slash", req{url: "/user/ada/nb", cookie: auth.SessionCookie + "=ada-cookie"}, 302, "/user/ada/nb/"},
		{"a cross-origin POST", req{method: "POST", url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=ada-cookie", origin: "http://evil.example"}, 403, "cross-origin"},
		{"a same-origin POST", req{method: "POST", url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=ada-cookie", origin: "SELF"}, 200, `"path"`},
		{"outside /user/", req{url: "/servers"}, 200, "broker page"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.r.origin == "SELF" {
				tc.r.origin = f.srv.URL
			}
			resp, body := f.do(tc.r)
			got := body + " " + resp.Header.Get("Location")
			if resp.StatusCode != tc.status || !strings.Contains(got, tc.want) {
				t.Errorf("%d %q, want %d with %q", resp.StatusCode, got, tc.status, tc.want)
			}
			if strings.Contains(got, "nbtoken-") {
				t.Errorf("the notebook token reached the caller: %q", got)
			}
		})
	}
}

// TestAdminAccessWhenAllowed lets an admin in when the setting allows it.
func TestAdminAccessWhenAllowed(t *testing.T) {
	f := newFixture(t, proxy.ModePath, true)
	resp, body := f.do(req{url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=root-cookie"})
	if resp.StatusCode != 200 || !strings.Contains(body, `"path":"/user/ada/nb/echo"`) {
		t.Errorf("admin: %d %q, want the notebook", resp.StatusCode, body)
	}
	if resp, _ := f.do(req{url: "/user/ada/old/api", cookie: auth.SessionCookie + "=root-cookie"}); resp.StatusCode != 503 {
		t.Errorf("admin on a stopped server: %d, want 503", resp.StatusCode)
	}
}

// TestWhatTheNotebookSeesAndSends checks the forwarded request (the token
// added, the broker's cookies and credentials gone, the browser's host
// kept) and the cleaned answer (no broker cookie, no origin-wide service
// worker).
func TestWhatTheNotebookSeesAndSends(t *testing.T) {
	f := newFixture(t, proxy.ModePath, false)
	_, body := f.do(req{url: "/user/ada/nb/echo", cookie: auth.SessionCookie + "=ada-cookie; _xsrf=abc; gpubroker_login=x"})
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	if s.Authorization != sha256Hex("token "+tokenOf("sp1")) {
		t.Errorf("Authorization %q, want the notebook token", s.Authorization)
	}
	if len(s.Cookies) != 1 || s.Cookies["_xsrf"] != "abc" {
		t.Errorf("cookies %v, want only the notebook's _xsrf", s.Cookies)
	}
	if host := f.srv.Listener.Addr().String(); s.Host != host || s.Forwarded != host {
		t.Errorf("host %q, X-Forwarded-Host %q, want the browser's %q", s.Host, s.Forwarded, host)
	}
	_, body = f.do(req{url: "/user/ada/nb/echo", bearer: "ada-jwt"})
	if !strings.Contains(body, `"authorization":"`+sha256Hex("token "+tokenOf("sp1"))) {
		t.Errorf("with a bearer token the notebook got %q, want only its own token", body)
	}
	resp, _ := f.do(req{url: "/user/ada/nb/setcookie", cookie: auth.SessionCookie + "=ada-cookie"})
	sc := resp.Header.Values("Set-Cookie")
	if len(sc) != 1 || !strings.HasPrefix(sc[0], "_xsrf=") {
		t.Errorf("Set-Cookie %q, want only the notebook's _xsrf", sc)
	}
	if v := resp.Header.Get("Service-Worker-Allowed"); v != "" {
		t.Errorf("Service-Worker-Allowed %q passed in path mode", v)
	}
}

// TestTheTokenNeverReachesTheBrowser checks that the notebook's token,
// which Jupyter writes into its own pages, is taken out of the answer,
// even when it is split across two writes.
func TestTheTokenNeverReachesTheBrowser(t *testing.T) {
	f := newFixture(t, proxy.ModePath, false)
	resp, body := f.do(req{url: "/user/ada/nb/page", cookie: auth.SessionCookie + "=ada-cookie", accept: html})
	if resp.StatusCode != 200 || strings.Contains(body, "nbtoken-") || !strings.Contains(body, `data-jupyter-api-token=""`) {
		t.Errorf("%d %q: want the page without its token", resp.StatusCode, body)
	}
}

// TestStreamsWithoutBuffering reads the first chunk of an answer while the
// notebook is still writing it.
func TestStreamsWithoutBuffering(t *testing.T) {
	f := newFixture(t, proxy.ModePath, false)
	hr, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/user/ada/nb/stream", nil)
	hr.Header.Set("Cookie", auth.SessionCookie+"=ada-cookie")
	c := f.client(nil)
	defer c.CloseIdleConnections()
	resp, err := c.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	close(f.release) // only now may the notebook finish
	if line, err = br.ReadString('\n'); err != nil || line != "second\n" {
		t.Errorf("second chunk %q, %v", line, err)
	}
}

// TestWebSocketsAndActivity echoes over a WebSocket through the proxy,
// refuses one from another origin, and checks the activity it records.
func TestWebSocketsAndActivity(t *testing.T) {
	f := newFixture(t, proxy.ModePath, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	wsURL := "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/user/ada/nb/ws"
	dial := func(origin string) (*websocket.Conn, error) {
		cfg, err := websocket.NewConfig(wsURL, origin)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Header.Set("Cookie", auth.SessionCookie+"=ada-cookie")
		return websocket.DialConfig(cfg)
	}
	if c, err := dial("http://evil.example"); err == nil {
		c.Close()
		t.Fatal("a WebSocket from another origin was let through")
	}
	before := time.Now()
	c, err := dial(f.srv.URL)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	for _, msg := range []string{"hello", "kernel"} {
		if err := websocket.Message.Send(c, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(c, &got); err != nil || got != msg {
			t.Fatalf("echo %q, %v; want %q", got, err, msg)
		}
	}
	a, ok := f.p.Activity("sp1")
	if !ok || a.OpenWebSockets != 1 || a.LastRequest.Before(before.Add(-time.Second)) {
		t.Errorf("activity while open: %+v %t, want one open WebSocket and a recent request", a, ok)
	}
	if n := f.metrics.n.Load(); n != 1 {
		t.Errorf("%d proxied connections counted while one WebSocket is open, want 1", n)
	}
	waitFor(t, "the open WebSocket is flushed", func() bool { got, ok := f.act.get("sp1"); return ok && got.OpenWebSockets == 1 })
	c.Close()
	waitFor(t, "the closed WebSocket is flushed", func() bool { got, ok := f.act.get("sp1"); return ok && got.OpenWebSockets == 0 })
	waitFor(t, "the closed WebSocket is no longer counted", func() bool { return f.metrics.n.Load() == 0 })
	if _, ok := f.p.Activity("sp2"); ok {
		t.Error("activity recorded for a spawn nobody used")
	}
}

// TestNotebookNotAnswering gets a page, not a raw error, when the pod does
// not answer.
func TestNotebookNotAnswering(t *testing.T) {
	f := newFixture(t, proxy.ModePath, false)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	f.servers.put(fleet.Server{ServerKey: fleet.ServerKey{User: "ada", Name: "nb"}, SpawnID: "sp1", State: v1.StateRunning, URL: dead.URL})
	resp, body := f.do(req{url: "/user/ada/nb/tree", cookie: auth.SessionCookie + "=ada-cookie", accept: html})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "not answering") {
		t.Errorf("%d %q, want 502 with the notebook page", resp.StatusCode, body)
	}
}

// TestHostModeHandOff walks a browser through host mode: the broker's
// origin hands off with a one-time code, the notebook host sets its own
// cookie, and only that cookie opens that server's host, while its web
// session lives.
func TestHostModeHandOff(t *testing.T) {
	f := newFixture(t, proxy.ModeHost, false)
	port := f.srv.Listener.Addr().(*net.TCPAddr).Port
	brokerURL, _ := url.Parse(f.srv.URL)
	jar, _ := cookiejar.New(nil)
	jar.SetCookies(brokerURL, []*http.Cookie{{Name: auth.SessionCookie, Value: "ada-cookie"}})
	c := f.client(jar)
	defer c.CloseIdleConnections()
	get := func(u string) (*http.Response, string) {
		t.Helper()
		hr, _ := http.NewRequest(http.MethodGet, u, nil)
		hr.Header.Set("Accept", html)
		resp, err := c.Do(hr)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(b)+resp.Header.Get("Location"), "nbtoken-") {
			t.Errorf("GET %s: the notebook token reached the browser", u)
		}
		return resp, string(b)
	}
	host := func(label string) string { return "http://" + net.JoinHostPort(label+"."+domain, itoa(port)) }
	adaHost := host(spawner.PodName("ada", "nb"))

	// Straight to the notebook host without a cookie: back to the broker.
	resp, _ := get(adaHost + "/user/ada/nb/tree")
	if resp.StatusCode != 303 || resp.Header.Get("Location") != f.srv.URL+"/user/ada/nb/tree" {
		t.Fatalf("no host cookie: %d %s, want a redirect to the broker's origin", resp.StatusCode, resp.Header.Get("Location"))
	}
	// The broker's origin hands off.
	resp, _ = get(f.srv.URL + "/user/ada/nb/tree?x=1")
	handoff := resp.Header.Get("Location")
	if resp.StatusCode != 303 || !strings.HasPrefix(handoff, adaHost+proxy.HandoffPath+"?code=") {
		t.Fatalf("entry: %d %s, want the hand-off to %s", resp.StatusCode, handoff, adaHost)
	}
	resp, _ = get(handoff)
	if resp.StatusCode != 303 || resp.Header.Get("Location") != "/user/ada/nb/tree?x=1" {
		t.Fatalf("redeem: %d %s, want the notebook path", resp.StatusCode, resp.Header.Get("Location"))
	}
	sc := resp.Header.Get("Set-Cookie")
	if !strings.Contains(sc, "HttpOnly") || strings.Contains(strings.ToLower(sc), "domain=") {
		t.Errorf("host cookie %q: want HttpOnly and host-only", sc)
	}
	resp, body := get(adaHost + "/user/ada/nb/echo")
	if resp.StatusCode != 200 || !strings.Contains(body, `"authorization":"`+sha256Hex("token "+tokenOf("sp1"))) || strings.Contains(body, "gpubroker_nb") {
		t.Fatalf("with the host cookie: %d %q, want the notebook with its token and without the broker's cookie", resp.StatusCode, body)
	}
	if resp, body := get(handoff); resp.StatusCode != 400 || !strings.Contains(body, "already used") {
		t.Errorf("a code used twice: %d %q, want 400", resp.StatusCode, body)
	}
	// The same cookie does not open another server's host, nor is it sent there.
	bobHost := host(spawner.PodName("bob", "nb"))
	if resp, _ := get(bobHost + "/user/bob/nb/echo"); resp.StatusCode != 303 {
		t.Errorf("bob's host with ada's cookies: %d, want the redirect to sign in", resp.StatusCode)
	}
	// A path of another server on ada's host is not found.
	if resp, _ := get(adaHost + "/user/bob/nb/echo"); resp.StatusCode != 404 {
		t.Errorf("bob's server on ada's host: %d, want 404", resp.StatusCode)
	}
	// Cross-origin writes to the notebook host are refused.
	hr, _ := http.NewRequest(http.MethodPost, adaHost+"/user/ada/nb/echo", nil)
	hr.Header.Set("Origin", bobHost)
	if resp, err := c.Do(hr); err != nil || resp.StatusCode != 403 {
		t.Errorf("POST from bob's host: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	// Signing out of the broker ends the host's session too.
	f.auth.endSession("ada-cookie")
	if resp, _ := get(adaHost + "/user/ada/nb/echo"); resp.StatusCode != 303 {
		t.Errorf("after sign-out: %d, want the redirect to sign in again", resp.StatusCode)
	}
}

// TestHostModeStoppedServer shows the status page on the broker's origin.
func TestHostModeStoppedServer(t *testing.T) {
	f := newFixture(t, proxy.ModeHost, false)
	resp, body := f.do(req{url: "/user/ada/old/tree", cookie: auth.SessionCookie + "=ada-cookie", accept: html})
	if resp.StatusCode != 200 || !strings.Contains(body, "notebook page for ada/old") {
		t.Errorf("%d %q, want the stopped page", resp.StatusCode, body)
	}
	if got := f.p.OpenURL("ada", "nb"); got != f.srv.URL+"/user/ada/nb/" {
		t.Errorf("OpenURL %q", got)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	_, err := proxy.New(proxy.Config{Mode: "x", PublicURL: "ftp://h/p"}, proxy.Deps{})
	for _, want := range []string{`mode "x"`, "public URL", "Deps.Servers", "Deps.Pages"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want %q", err, want)
		}
	}
	_, err = proxy.New(proxy.Config{Mode: proxy.ModeHost, PublicURL: "https://b.example"}, proxy.Deps{})
	if err == nil || !strings.Contains(err.Error(), "notebook domain") || !strings.Contains(err.Error(), "hand-off store") {
		t.Errorf("host mode without domain and store: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		<-tick.C
	}
}
