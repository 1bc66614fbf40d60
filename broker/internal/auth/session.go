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
	"github.com/redis/go-redis/v9"
	"golang.org/x/oauth2"
)

// Redis keys of the web login: redisschema.Keys.Login, Session and
// SessionRefresh (see the table there). Cookie values, states and session
// ids never appear in a key: keys hold their SHA-256, so a copy of Redis's
// key space does not hand out sessions. Every key has a TTL.
func (w *Web) loginKey(state string) string { return w.keys.Login(state) }
func (w *Web) sessionKey(id string) string  { return w.keys.Session(id) }
func (w *Web) refreshKey(id string) string  { return w.keys.SessionRefresh(id) }

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// maxCookieBytes bounds the session cookie values looked up in Redis.
const maxCookieBytes = 128

// refreshPoll is how often a replica that lost the refresh lock looks for
// the winner's result.
const refreshPoll = 50 * time.Millisecond

// releaseLock deletes KEYS[1] only if it still holds ARGV[1] (the lock
// token), so a lock that expired and was taken by another replica is kept.
// Returns 1 when deleted, 0 otherwise.
var releaseLock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

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
	found, err := w.getJSON(ctx, w.sessionKey(c.Value), &rec)
	if err != nil {
		return Session{}, err
	}
	if !found {
		return Session{}, errSessionEnded
	}
	now := w.now()
	if !now.Before(rec.Created.Add(w.cfg.SessionTTL)) {
		// Redis's TTL only collects garbage; the clock decides.
		if err := w.rdb.Del(ctx, w.sessionKey(c.Value)).Err(); err != nil {
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
	key, lock, token := w.sessionKey(id), w.refreshKey(id), rand.Text()
	tick := time.NewTicker(refreshPoll)
	defer tick.Stop()
	var rec sessionRecord
	for {
		won, err := w.rdb.SetNX(ctx, lock, token, refreshTimeout).Result()
		if err != nil {
			return rec, fmt.Errorf("auth: refresh lock: %w", err)
		}
		found, err := w.getJSON(ctx, key, &rec)
		if err != nil || !found || w.now().Before(rec.Expiry.Add(-w.cfg.RefreshSkew)) {
			if won {
				w.unlock(ctx, lock, token)
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
	defer w.unlock(ctx, lock, token)
	end := func() (sessionRecord, error) {
		if err := w.rdb.Del(ctx, key).Err(); err != nil {
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
	if err := w.rdb.SetArgs(ctx, key, b, redis.SetArgs{Mode: "XX", KeepTTL: true}).Err(); err != nil {
		if errors.Is(err, redis.Nil) {
			return rec, errSessionEnded
		}
		return rec, fmt.Errorf("auth: store refreshed session: %w", err)
	}
	return rec, nil
}

func (w *Web) unlock(ctx context.Context, lock, token string) {
	if err := releaseLock.Run(ctx, w.rdb, []string{lock}, token).Err(); err != nil {
		// The lock expires by itself within refreshTimeout.
		w.log.WarnContext(ctx, "release session refresh lock", "err", err)
	}
}

func (w *Web) putJSON(ctx context.Context, key string, v any, ttl time.Duration) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("auth: encode: %w", err)
	}
	if err := w.rdb.Set(ctx, key, b, ttl).Err(); err != nil {
		return fmt.Errorf("auth: store: %w", err)
	}
	return nil
}

func (w *Web) getJSON(ctx context.Context, key string, v any) (bool, error) {
	b, err := w.rdb.Get(ctx, key).Bytes()
	return decodeStored(b, err, v)
}

// takeJSON reads and deletes key in one step (GETDEL): single use.
func (w *Web) takeJSON(ctx context.Context, key string, v any) (bool, error) {
	b, err := w.rdb.GetDel(ctx, key).Bytes()
	return decodeStored(b, err, v)
}

func decodeStored(b []byte, err error, v any) (bool, error) {
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("auth: session storage: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		// A record this code cannot read is as good as none.
		return false, nil
	}
	return true, nil
}
