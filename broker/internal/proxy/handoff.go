package proxy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// Host mode's login hand-off (see the package doc):
//
//  1. The browser asks the broker's origin for /user/<u>/<s>/<path>. With a
//     web session that may open the running server, the broker stores a
//     one-time code (handoffRecord, Config.HandoffTTL) and redirects to
//     https://<label>.<domain>/.gpubroker/handoff?code=<code>.
//  2. The notebook host redeems the code (taken and deleted in one step,
//     checked against its own label), stores a host session
//     (hostSession) and sets its id in a host-only, HttpOnly cookie, then
//     redirects to <path>, which it keeps from step 1 (never from the URL).
//  3. Each later request on the host carries the cookie; the session must
//     name this host's server and its current spawn, and the web session it
//     came from must still exist.

// hostCookieName is the notebook host's session cookie: with the __Host-
// prefix over https (the browser then insists on Secure, Path=/ and no
// Domain, so no other host can set or read it).
func (p *Proxy) hostCookieName() string {
	if p.secure {
		return "__Host-gpubroker_nb"
	}
	return "gpubroker_nb"
}

// hostSession is a stored notebook host session: whose server, which
// start of it, on which host, for whom, from which web session, until when.
type hostSession struct {
	User    string `json:"u"`
	Server  string `json:"s"`
	SpawnID string `json:"sp"`
	Label   string `json:"l"`
	// Viewer is who signed in (the owner, or an admin).
	Viewer string `json:"v"`
	Admin  bool   `json:"a,omitempty"`
	// Web is the digest of the web session's cookie value.
	Web string `json:"w"`
	// Expires is the end, Unix seconds: the web session's for a code.
	Expires int64 `json:"e"`
}

// handoffRecord is a stored hand-off code's value: the host session it
// becomes and where to go on the notebook host (path and query).
type handoffRecord struct {
	hostSession
	Path string `json:"p"`
}

func digestHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// handOff sends a signed-in browser on to srv's host with a fresh code.
func (p *Proxy) handOff(w http.ResponseWriter, r *http.Request, srv fleet.Server, sess auth.Session) {
	ctx := r.Context()
	c, err := r.Cookie(auth.SessionCookie)
	if err != nil || c.Value == "" {
		p.refuse(w, r, auth.ErrNoCredentials)
		return
	}
	label := spawner.PodName(srv.User, srv.Name)
	rec := handoffRecord{Path: r.URL.RequestURI(), hostSession: hostSession{User: srv.User, Server: srv.Name, SpawnID: srv.SpawnID,
		Label: label, Viewer: sess.Principal.User, Admin: sess.Principal.Admin, Web: digestHex(c.Value), Expires: sess.Expires.Unix()}}
	v, err := json.Marshal(rec)
	if err != nil {
		p.unavailable(w, r, err)
		return
	}
	code := rand.Text()
	if err := p.deps.Handoffs.PutHandoff(ctx, code, v, p.cfg.HandoffTTL); err != nil {
		p.unavailable(w, r, fmt.Errorf("store hand-off code: %w", err))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, p.hostOrigin(label)+HandoffPath+"?code="+url.QueryEscape(code), http.StatusSeeOther)
}

// redeem turns a hand-off code into the notebook host's session cookie.
func (p *Proxy) redeem(w http.ResponseWriter, r *http.Request, label string) {
	ctx := r.Context()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	code := r.URL.Query().Get("code")
	if r.Method != http.MethodGet || code == "" || len(code) > 64 {
		plain(w, http.StatusBadRequest, "invalid", "a hand-off needs its code")
		return
	}
	v, ok, err := p.deps.Handoffs.TakeHandoff(ctx, code)
	if err != nil {
		p.unavailable(w, r, fmt.Errorf("take hand-off code: %w", err))
		return
	}
	var rec handoffRecord
	if ok {
		ok = json.Unmarshal(v, &rec) == nil && rec.Label == label
	}
	now := p.now()
	if !ok || now.Unix() >= rec.Expires {
		// Used, expired or for another host: start over on the broker's
		// origin, which signs in and hands off again.
		p.deps.Pages.Error(w, r, http.StatusBadRequest, "This sign-in link was already used or has expired. Open the notebook again from your servers.")
		return
	}
	ttl := min(p.cfg.HostSessionTTL, time.Unix(rec.Expires, 0).Sub(now))
	hs := rec.hostSession
	hs.Expires = now.Add(ttl).Unix()
	hv, err := json.Marshal(hs)
	if err != nil {
		p.unavailable(w, r, err)
		return
	}
	id := rand.Text() + rand.Text()
	if err := p.deps.Handoffs.PutHostSession(ctx, id, hv, ttl); err != nil {
		p.unavailable(w, r, fmt.Errorf("store host session: %w", err))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: p.hostCookieName(), Value: id, Path: "/", MaxAge: int(ttl / time.Second),
		HttpOnly: true, Secure: p.secure, SameSite: http.SameSiteLaxMode})
	next := rec.Path
	if !strings.HasPrefix(next, "/user/") {
		next = spawner.BaseURL(rec.User, rec.Server)
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// hostPrincipal authenticates a request on a notebook host: a bearer token,
// else the host session cookie (returned too). Errors match
// auth.ErrUnauthenticated when there is no valid credential.
func (p *Proxy) hostPrincipal(ctx context.Context, r *http.Request, label string) (auth.Principal, *hostSession, error) {
	pr, err := p.bearer(ctx, r)
	if !errors.Is(err, auth.ErrNoCredentials) {
		return pr, nil, err
	}
	c, err := r.Cookie(p.hostCookieName())
	if err != nil || c.Value == "" || len(c.Value) > 128 {
		return auth.Principal{}, nil, auth.ErrNoCredentials
	}
	hs, err := p.checkHostSession(ctx, c.Value)
	if err != nil {
		return auth.Principal{}, nil, err
	}
	if hs.Label != label {
		return auth.Principal{}, nil, auth.ErrNoCredentials
	}
	return auth.Principal{User: hs.Viewer, Admin: hs.Admin}, &hs, nil
}

// checkHostSession reads and checks a host session, trusting a checked one
// for Config.SessionCheck.
func (p *Proxy) checkHostSession(ctx context.Context, id string) (hostSession, error) {
	now := p.now()
	key := digestHex(id)
	if hs, ok := p.hosts.get(key, now); ok {
		return hs, nil
	}
	v, ok, err := p.deps.Handoffs.HostSession(ctx, id)
	if err != nil {
		return hostSession{}, fmt.Errorf("read host session: %w", err)
	}
	var hs hostSession
	if !ok || json.Unmarshal(v, &hs) != nil || now.Unix() >= hs.Expires {
		return hostSession{}, &auth.Error{Reason: "the notebook's session ended; open it again"}
	}
	alive, err := p.deps.Handoffs.WebSessionAlive(ctx, hs.Web)
	if err != nil {
		return hostSession{}, fmt.Errorf("read web session: %w", err)
	}
	if !alive {
		return hostSession{}, &auth.Error{Reason: "you signed out; sign in again"}
	}
	p.hosts.put(key, hs, now.Add(p.cfg.SessionCheck))
	return hs, nil
}

// hostCache holds checked host sessions until their recheck time.
type hostCache struct {
	mu sync.Mutex
	m  map[string]hostCacheEntry
}

type hostCacheEntry struct {
	hs    hostSession
	until time.Time
}

func newHostCache() *hostCache { return &hostCache{m: map[string]hostCacheEntry{}} }

func (c *hostCache) get(key string, now time.Time) (hostSession, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !now.Before(e.until) {
		delete(c.m, key)
		return hostSession{}, false
	}
	return e.hs, true
}

func (c *hostCache) put(key string, hs hostSession, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= cacheLimit {
		clear(c.m)
	}
	c.m[key] = hostCacheEntry{hs: hs, until: until}
}
