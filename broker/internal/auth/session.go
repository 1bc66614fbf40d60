package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// SessionStore keeps the web login's records (implemented by
// broker/internal/redisstore.Sessions, in Redis under keys that hold the
// SHA-256 of each value, never the value). Values are opaque bytes (the
// records' JSON); every record has a TTL. Implementations are safe for
// concurrent use, also across replicas.
type SessionStore interface {
	Logins
	Sessions
	RefreshLocks
}

// Logins keeps pending sign-ins by their OAuth state.
type Logins interface {
	// PutLogin stores the pending sign-in of state for ttl.
	PutLogin(ctx context.Context, state string, v []byte, ttl time.Duration) error
	// TakeLogin returns and deletes it in one step (single use); ok is
	// false when there is none.
	TakeLogin(ctx context.Context, state string) (v []byte, ok bool, err error)
}

// Sessions keeps the signed-in sessions by their cookie value.
type Sessions interface {
	// Session returns session id's record; ok is false when there is none.
	Session(ctx context.Context, id string) (v []byte, ok bool, err error)
	// PutSession stores session id for ttl.
	PutSession(ctx context.Context, id string, v []byte, ttl time.Duration) error
	// ReplaceSession rewrites an existing session, keeping its TTL; ok is
	// false (and nothing is written) when it no longer exists.
	ReplaceSession(ctx context.Context, id string, v []byte) (ok bool, err error)
	// DeleteSession ends session id; ending none is not an error.
	DeleteSession(ctx context.Context, id string) error
}

// RefreshLocks are the per-session locks of the replica refreshing a
// session's tokens.
type RefreshLocks interface {
	// LockRefresh takes session id's lock with token for ttl; false when
	// another holds it.
	LockRefresh(ctx context.Context, id, token string, ttl time.Duration) (bool, error)
	// UnlockRefresh releases the lock if token still holds it (one that
	// expired and was taken by another replica is kept).
	UnlockRefresh(ctx context.Context, id, token string) error
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// maxCookieBytes bounds the session cookie values looked up in Redis.
const maxCookieBytes = 128

// refreshPoll is how often a replica that lost the refresh lock looks for
// the winner's result.
const refreshPoll = 50 * time.Millisecond

// storedPrincipal is the part of a Principal a session keeps. Admin is not
// stored: it is derived from the groups and the configured admin group on
// every read.
type storedPrincipal struct {
	Subject string   `json:"sub"`
	User    string   `json:"user"`
	Groups  []string `json:"groups,omitempty"`
}

func toStored(p Principal) storedPrincipal {
	return storedPrincipal{Subject: p.Subject, User: p.User, Groups: p.Groups}
}

// sessionRecord is a session as stored in Redis (JSON).
type sessionRecord struct {
	Principal    storedPrincipal `json:"principal"`
	CSRF         string          `json:"csrf"`
	IDToken      string          `json:"idToken"`
	AccessToken  string          `json:"accessToken"`
	RefreshToken string          `json:"refreshToken,omitempty"`
	// Expiry is when the tokens expire; a request refreshes them
	// RefreshSkew before.
	Expiry    time.Time `json:"expiry"`
	Created   time.Time `json:"created"`
	Refreshes int       `json:"refreshes"`
}

func (w *Web) principalOf(rec sessionRecord) Principal {
	return Principal{
		Subject: rec.Principal.Subject, User: rec.Principal.User, Groups: rec.Principal.Groups,
		Admin: w.cfg.AdminGroup != "" && slices.Contains(rec.Principal.Groups, w.cfg.AdminGroup),
	}
}

// Session returns the signed-in session of r's cookie, refreshing its
// tokens first when they are due (once per session, across requests and
// replicas; a refresh picks up the user's current groups). Errors:
// ErrNoCredentials without a session cookie; an *Error (matching
// ErrUnauthenticated) when the session ended (logged out, expired, refresh
// refused); ErrUnavailable when a due refresh cannot reach the issuer;
// other errors when Redis fails.
func (w *Web) Session(ctx context.Context, r *http.Request) (Session, error) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return Session{}, ErrNoCredentials
	}
	if len(c.Value) > maxCookieBytes {
		return Session{}, errSessionEnded
	}
	var rec sessionRecord
	found, err := w.getJSON(ctx, c.Value, &rec)
	if err != nil {
		return Session{}, err
	}
	if !found {
		return Session{}, errSessionEnded
	}
	now := w.now()
	if !now.Before(rec.Created.Add(w.cfg.SessionTTL)) {
		// Redis's TTL only collects garbage; the clock decides.
		if err := w.store.DeleteSession(ctx, c.Value); err != nil {
			return Session{}, fmt.Errorf("auth: end session: %w", err)
		}
		return Session{}, errSessionEnded
	}
	if !now.Before(rec.Expiry.Add(-w.cfg.RefreshSkew)) {
		if rec, err = w.refresh(ctx, c.Value); err != nil {
			return Session{}, err
		}
	}
	return Session{Principal: w.principalOf(rec), CSRF: rec.CSRF, Expires: rec.Created.Add(w.cfg.SessionTTL)}, nil
}

// Authenticate implements Authenticator for requests that carry the session
// cookie (pages' own API calls, the browser's event streams). Methods other
// than GET, HEAD and OPTIONS must send the session's CSRF token in
// CSRFHeader, else ErrCSRF. Without the cookie it returns ErrNoCredentials,
// so put it last in a Chain.
func (w *Web) Authenticate(ctx context.Context, r *http.Request) (Principal, error) {
	s, err := w.Session(ctx, r)
	if err != nil {
		return Principal{}, err
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		if !CheckCSRF(s, r.Header.Get(CSRFHeader)) {
			return Principal{}, ErrCSRF
		}
	}
	return s.Principal, nil
}

// CheckCSRF reports whether token is s's CSRF token (constant time).
func CheckCSRF(s Session, token string) bool {
	return s.CSRF != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.CSRF)) == 1
}

// refresh refreshes the session's tokens once, however many requests of
// this process ask at the same time (singleflight) and however many
// replicas do (a lock in Redis; losers wait for the winner's result). The
// shared work runs on a context detached from any one caller and bounded
// by refreshTimeout, so one caller leaving does not fail the others.
func (w *Web) refresh(ctx context.Context, id string) (sessionRecord, error) {
	ch := w.flight.DoChan(digest(id), func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refreshTimeout)
		defer cancel()
		return w.refreshOnce(rctx, id)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return sessionRecord{}, res.Err
		}
		rec, ok := res.Val.(sessionRecord)
		if !ok {
			return sessionRecord{}, fmt.Errorf("auth: refresh returned %T", res.Val)
		}
		return rec, nil
	case <-ctx.Done():
		return sessionRecord{}, fmt.Errorf("auth: wait for session refresh: %w", ctx.Err())
	}
}

func (w *Web) refreshOnce(ctx context.Context, id string) (sessionRecord, error) {
	token := rand.Text()
	tick := time.NewTicker(refreshPoll)
	defer tick.Stop()
	var rec sessionRecord
	for {
		won, err := w.store.LockRefresh(ctx, id, token, refreshTimeout)
		if err != nil {
			return rec, fmt.Errorf("auth: refresh lock: %w", err)
		}
		found, err := w.getJSON(ctx, id, &rec)
		if err != nil || !found || w.now().Before(rec.Expiry.Add(-w.cfg.RefreshSkew)) {
			if won {
				w.unlock(ctx, id, token)
			}
			switch {
			case err != nil:
				return rec, err
			case !found:
				return rec, errSessionEnded
			}
			return rec, nil // refreshed meanwhile, here or by another replica
		}
		if won {
			break
		}
		select {
		case <-ctx.Done():
			return rec, fmt.Errorf("%w: another replica's session refresh did not finish: %w", ErrUnavailable, ctx.Err())
		case <-tick.C:
		}
	}
	defer w.unlock(ctx, id, token)
	end := func() (sessionRecord, error) {
		if err := w.store.DeleteSession(ctx, id); err != nil {
			return rec, fmt.Errorf("auth: end session: %w", err)
		}
		return rec, errSessionEnded
	}
	if rec.RefreshToken == "" {
		return end()
	}
	_, conf, err := w.discover(ctx)
	if err != nil {
		return rec, err
	}
	tok, err := conf.TokenSource(oidc.ClientContext(ctx, w.client), &oauth2.Token{RefreshToken: rec.RefreshToken}).Token()
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.Response != nil && re.Response.StatusCode < 500 {
			w.log.InfoContext(ctx, "session refresh refused; the session ends", "user", rec.Principal.User, "reason", re.ErrorCode)
			return end()
		}
		return rec, fmt.Errorf("%w: refresh: %w", ErrUnavailable, err)
	}
	rec.AccessToken = tok.AccessToken
	if tok.RefreshToken != "" {
		rec.RefreshToken = tok.RefreshToken
	}
	rec.Expiry = tok.Expiry
	if raw, _ := tok.Extra("id_token").(string); raw != "" {
		idt, err := w.verifier().Verify(oidc.ClientContext(ctx, w.client), raw)
		if err != nil {
			w.log.WarnContext(ctx, "refreshed ID token did not verify; the session ends", "user", rec.Principal.User, "err", err)
			return end()
		}
		var claims map[string]any
		if err := idt.Claims(&claims); err != nil {
			return end()
		}
		p, err := w.claims.principal(idt.Subject, claims)
		if err != nil || idt.Subject != rec.Principal.Subject {
			return end()
		}
		rec.Principal, rec.IDToken = toStored(p), raw
		rec.Expiry = tokenExpiry(tok, idt)
	}
	if rec.Expiry.IsZero() {
		rec.Expiry = w.now().Add(5 * time.Minute)
	}
	rec.Refreshes++
	b, err := json.Marshal(rec)
	if err != nil {
		return rec, fmt.Errorf("auth: encode session: %w", err)
	}
	// XX: a logout that happened meanwhile wins.
	ok, err := w.store.ReplaceSession(ctx, id, b)
	if err != nil {
		return rec, fmt.Errorf("auth: store refreshed session: %w", err)
	}
	if !ok {
		return rec, errSessionEnded
	}
	return rec, nil
}

func (w *Web) unlock(ctx context.Context, id, token string) {
	if err := w.store.UnlockRefresh(ctx, id, token); err != nil {
		// The lock expires by itself within refreshTimeout.
		w.log.WarnContext(ctx, "release session refresh lock", "err", err)
	}
}

// putSession stores rec as session id for ttl.
func (w *Web) putSession(ctx context.Context, id string, rec sessionRecord, ttl time.Duration) error {
	return putRecord("session", rec, func(b []byte) error { return w.store.PutSession(ctx, id, b, ttl) })
}

// putLogin stores rec as the pending sign-in of state for loginTTL.
func (w *Web) putLogin(ctx context.Context, state string, rec loginRecord) error {
	return putRecord("sign-in", rec, func(b []byte) error { return w.store.PutLogin(ctx, state, b, loginTTL) })
}

// putRecord encodes rec (a what) and hands it to write.
func putRecord(what string, rec any, write func([]byte) error) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("auth: encode %s: %w", what, err)
	}
	if err := write(b); err != nil {
		return fmt.Errorf("auth: store %s: %w", what, err)
	}
	return nil
}

// getJSON reads session id into v.
func (w *Web) getJSON(ctx context.Context, id string, v any) (bool, error) {
	b, ok, err := w.store.Session(ctx, id)
	return decodeStored(b, ok, err, v)
}

func decodeStored(b []byte, ok bool, err error, v any) (bool, error) {
	if err != nil {
		return false, fmt.Errorf("auth: session storage: %w", err)
	}
	if !ok {
		return false, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		// A record this code cannot read is as good as none.
		return false, nil
	}
	return true, nil
}
