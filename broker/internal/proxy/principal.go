package proxy

// Who is asking: a bearer token, else the broker's web session (host
// mode's notebook-origin sessions are in handoff.go).

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
)

// bearer authenticates an "Authorization: Bearer" request; ErrNoCredentials
// when it carries none (or Bearer is off).
func (p *Proxy) bearer(ctx context.Context, r *http.Request) (auth.Principal, error) {
	if p.deps.Bearer == nil || !strings.HasPrefix(strings.ToLower(r.Header.Get("Authorization")), "bearer ") {
		return auth.Principal{}, auth.ErrNoCredentials
	}
	return p.deps.Bearer.Authenticate(ctx, r)
}

// webPrincipal authenticates by bearer token, else by the web session.
func (p *Proxy) webPrincipal(ctx context.Context, r *http.Request) (auth.Principal, auth.Session, error) {
	pr, err := p.bearer(ctx, r)
	if !errors.Is(err, auth.ErrNoCredentials) {
		return pr, auth.Session{}, err
	}
	s, err := p.webSession(ctx, r)
	if err != nil {
		return auth.Principal{}, auth.Session{}, err
	}
	return s.Principal, s, nil
}

// webSession reads r's web session, trusting one it checked for
// Config.SessionCheck (as host sessions are): a notebook's many small
// requests (its API calls, its files) do not each read Redis, and a
// sign-out takes effect within SessionCheck. Only sessions that were found
// are kept, by the digest of their cookie; never past their end.
func (p *Proxy) webSession(ctx context.Context, r *http.Request) (auth.Session, error) {
	c, err := r.Cookie(auth.SessionCookie)
	if err != nil || c.Value == "" {
		return p.deps.Sessions.Session(ctx, r)
	}
	now := p.now()
	key := digestHex(c.Value)
	if s, ok := p.webs.get(key, now); ok {
		return s, nil
	}
	s, err := p.deps.Sessions.Session(ctx, r)
	if err != nil {
		return auth.Session{}, err
	}
	until := now.Add(p.cfg.SessionCheck)
	if !s.Expires.IsZero() && s.Expires.Before(until) {
		until = s.Expires
	}
	p.webs.put(key, s, until)
	return s, nil
}
