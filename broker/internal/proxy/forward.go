package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// brokerCookie reports whether a cookie name is the broker's own (the web
// login's gpubroker_* and the notebook hosts' session cookie): such
// cookies never reach a notebook, and a notebook may not set them.
func brokerCookie(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "gpubroker_") || strings.HasPrefix(n, "__host-gpubroker")
}

// upstreamKey carries a proxied request's notebook address and token from
// proxyTo to the reverse proxy's Rewrite.
type upstreamKey struct{}

type upstream struct {
	base  *url.URL // http://<pod IP>:<port>
	token string
	srv   fleet.Server
}

// newForwarder builds the reverse proxy: httputil.ReverseProxy streams
// bodies (FlushInterval -1: every write is flushed, nothing is buffered)
// and tunnels WebSocket upgrades.
func (p *Proxy) newForwarder(rt http.RoundTripper) http.Handler {
	if rt == nil {
		rt = &http.Transport{
			Proxy:                 nil, // the notebooks are in the cluster; never an outbound proxy
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          512,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			up := pr.In.Context().Value(upstreamKey{}).(upstream)
			pr.SetURL(up.base)
			// The notebook sees the browser's host: Jupyter checks the
			// WebSocket Origin against it.
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			h := pr.Out.Header
			h.Del("Authorization")
			h.Del("X-Gpubroker-Groups")
			h.Del("X-Csrf-Token")
			filterCookies(h)
			h.Set("Authorization", "token "+up.token)
			h.Set("Accept-Encoding", "identity") // answers are scanned for the token (scrub)
		},
		FlushInterval: -1,
		Transport:     rt,
		BufferPool:    copyBuffers{},
		ModifyResponse: func(resp *http.Response) error {
			cleanResponse(resp.Header, p.cfg.Mode == ModePath)
			up, _ := resp.Request.Context().Value(upstreamKey{}).(upstream)
			return scrub(resp, up.token)
		},
		ErrorHandler: p.upstreamFailed,
		ErrorLog:     nil,
	}
}

// copyBuffers reuses the reverse proxy's 32 KiB copy buffers across
// requests (httputil.BufferPool).
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// filterCookies drops the broker's cookies from a request's Cookie header,
// keeping the notebook's own (its XSRF and login cookies).
func filterCookies(h http.Header) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var keep []string
	for _, line := range lines {
		for _, part := range strings.Split(line, ";") {
			part = strings.TrimSpace(part)
			name, _, _ := strings.Cut(part, "=")
			if part != "" && !brokerCookie(strings.TrimSpace(name)) {
				keep = append(keep, part)
			}
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// cleanResponse removes what a notebook may not send to the browser: any
// Set-Cookie of a broker cookie name, and in path mode the header that lets
// a service worker claim the whole shared origin.
func cleanResponse(h http.Header, pathMode bool) {
	if sc := h.Values("Set-Cookie"); len(sc) > 0 {
		h.Del("Set-Cookie")
		for _, c := range sc {
			name, _, _ := strings.Cut(c, "=")
			if !brokerCookie(strings.TrimSpace(name)) {
				h.Add("Set-Cookie", c)
			}
		}
	}
	if pathMode {
		h.Del("Service-Worker-Allowed")
	}
}

// proxyTo forwards r to srv's notebook, whose browser origin is origin.
func (p *Proxy) proxyTo(w http.ResponseWriter, r *http.Request, srv fleet.Server, origin string) {
	ctx := r.Context()
	if !sameOrigin(r, origin) {
		plain(w, http.StatusForbidden, "forbidden", "cross-origin request refused: it does not come from "+origin)
		return
	}
	base, err := url.Parse(srv.URL)
	if err != nil || base.Host == "" {
		p.unavailable(w, r, errors.New("server "+srv.User+"/"+srv.Name+" has a bad URL"))
		return
	}
	tok, err := p.token(ctx, srv)
	if err != nil {
		p.log.WarnContext(ctx, "notebook proxy: no notebook token", "user", srv.User, "server", srv.Name, "spawn_id", srv.SpawnID, "err", err)
		if wantsPage(r) {
			p.deps.Pages.Notebook(w, r, http.StatusBadGateway, srv.User, srv.Name, "The notebook's credentials cannot be read right now; try again in a few seconds.")
			return
		}
		plain(w, http.StatusBadGateway, "unavailable", "the notebook's credentials cannot be read right now")
		return
	}
	// Proxied requests may stream for long (downloads, event streams,
	// WebSockets): the server's whole-request deadlines do not apply.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	upgrade := isUpgrade(r)
	done := p.activity.begin(srv.SpawnID, p.now(), upgrade)
	defer done(p.now)
	p.deps.Metrics.ProxyOpened()
	defer p.deps.Metrics.ProxyClosed()
	r = r.WithContext(context.WithValue(ctx, upstreamKey{}, upstream{base: base, token: tok, srv: srv}))
	p.forward.ServeHTTP(w, r)
}

// sameOrigin refuses requests that a page of another origin made: unsafe
// methods and WebSocket handshakes whose Origin header names another
// origin. Requests without Origin (not from a browser script) pass; their
// credentials are checked as usual.
func sameOrigin(r *http.Request, origin string) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		if !isUpgrade(r) {
			return true
		}
	}
	o := r.Header.Get("Origin")
	return o == "" || strings.EqualFold(o, origin)
}

// upstreamFailed answers when the notebook could not be reached or broke
// off: a page that says so for a browser, 502 otherwise.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) || r.Context().Err() != nil {
		return // the browser went away
	}
	up, _ := r.Context().Value(upstreamKey{}).(upstream)
	p.log.InfoContext(r.Context(), "notebook proxy: notebook not answering", "user", up.srv.User, "server", up.srv.Name, "spawn_id", up.srv.SpawnID, "err", err)
	if wantsPage(r) {
		p.deps.Pages.Notebook(w, r, http.StatusBadGateway, up.srv.User, up.srv.Name, "The notebook is not answering; it may be restarting. Try again in a few seconds.")
		return
	}
	plain(w, http.StatusBadGateway, "bad_gateway", "the notebook is not answering; it may be restarting")
}
