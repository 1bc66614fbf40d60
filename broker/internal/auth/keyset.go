package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
)

// errBadSignature means no published key verifies the token.
var errBadSignature = errors.New("auth: token signature does not verify")

// errMalformed means the token is not a compact JWS.
var errMalformed = errors.New("auth: token is not a well-formed JWT")

// maxJWKSBytes bounds the JWKS response body.
const maxJWKSBytes = 1 << 20

// keySet is an oidc.KeySet over a JWKS URL with typed errors: errBadSignature
// when no key verifies, errMalformed for a token that does not parse, and
// ErrUnavailable when the JWKS cannot be fetched. It caches the keys and
// refetches when a token does not verify with them, at most once per
// minRefresh. Safe for concurrent use.
type keySet struct {
	url        string
	client     *http.Client
	now        func() time.Time
	algs       []jose.SignatureAlgorithm
	minRefresh time.Duration

	sem chan struct{} // one fetch at a time

	mu        sync.RWMutex
	keys      []jose.JSONWebKey
	fetchedAt time.Time // zero until the first successful fetch
}

var _ oidc.KeySet = (*keySet)(nil)

func newKeySet(url string, client *http.Client, now func() time.Time, algs []jose.SignatureAlgorithm, minRefresh time.Duration) *keySet {
	return &keySet{url: url, client: client, now: now, algs: algs, minRefresh: minRefresh, sem: make(chan struct{}, 1)}
}

// verifiedKey is the context key under which Bearer passes a token it has
// just verified with this key set, so that go-oidc's own call to
// VerifySignature for the same token does not verify the signature again.
type verifiedKey struct{}

type verifiedToken struct {
	raw     string
	payload []byte
}

// withVerified returns a copy of ctx that carries raw and its verified payload.
func withVerified(ctx context.Context, raw string, payload []byte) context.Context {
	return context.WithValue(ctx, verifiedKey{}, verifiedToken{raw: raw, payload: payload})
}

// VerifySignature returns the payload of jwt if a published key verifies it.
// A token that ctx marks as verified (withVerified, the same string) is not
// verified twice.
func (k *keySet) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	if v, ok := ctx.Value(verifiedKey{}).(verifiedToken); ok && v.raw == jwt {
		return v.payload, nil
	}
	jws, err := jose.ParseSignedCompact(jwt, k.algs)
	if err != nil || len(jws.Signatures) != 1 {
		return nil, errMalformed
	}
	kid := jws.Signatures[0].Header.KeyID
	k.mu.RLock()
	cached := k.keys
	k.mu.RUnlock()
	if p, ok := verifyWith(jws, kid, cached); ok {
		return p, nil
	}
	keys, err := k.refresh(ctx)
	if err != nil {
		return nil, err
	}
	if p, ok := verifyWith(jws, kid, keys); ok {
		return p, nil
	}
	return nil, errBadSignature
}

func verifyWith(jws *jose.JSONWebSignature, kid string, keys []jose.JSONWebKey) ([]byte, bool) {
	for _, key := range keys {
		if kid != "" && key.KeyID != kid {
			continue
		}
		if p, err := jws.Verify(key); err == nil {
			return p, true
		}
	}
	return nil, false
}

// refresh fetches the JWKS unless a fetch succeeded within minRefresh, and
// returns the current keys. Concurrent callers wait for one fetch.
func (k *keySet) refresh(ctx context.Context) ([]jose.JSONWebKey, error) {
	select {
	case k.sem <- struct{}{}:
		defer func() { <-k.sem }()
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: wait for key fetch: %w", ErrUnavailable, ctx.Err())
	}
	k.mu.RLock()
	keys, at := k.keys, k.fetchedAt
	k.mu.RUnlock()
	if !at.IsZero() && k.now().Sub(at) < k.minRefresh {
		return keys, nil
	}
	keys, err := k.fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: fetch keys from %s: %w", ErrUnavailable, k.url, err)
	}
	k.mu.Lock()
	k.keys, k.fetchedAt = keys, k.now()
	k.mu.Unlock()
	return keys, nil
}

// fetch GETs the JWKS and returns its public signing keys. Keys of unknown
// types, private keys and encryption keys are skipped.
func (k *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, r := range raw.Keys {
		var key jose.JSONWebKey
		if err := json.Unmarshal(r, &key); err != nil {
			continue // an unsupported key type must not hide the others
		}
		if !key.IsPublic() || (key.Use != "" && key.Use != "sig") {
			continue
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("the key set holds no public signing keys")
	}
	return keys, nil
}
