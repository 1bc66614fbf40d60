package devissuer

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Claims are the identity claims of a minted token.
type Claims struct {
	// Subject is the "sub" claim; required.
	Subject string
	// Username is the "preferred_username" claim; omitted when empty.
	Username string
	// Email is the "email" claim; omitted when empty.
	Email string
	// Groups is the "groups" claim (a JSON list); omitted when nil.
	Groups []string
	// Audience is the "aud" claim; "" means DefaultAudience.
	Audience string
	// ExpiresIn is the lifetime from now; 0 means DefaultExpiresIn. Negative
	// values are refused (use Expired).
	ExpiresIn time.Duration
	// Extra claims are set last and may override any claim above, for
	// example "groups": "one-string" or a custom username claim.
	Extra map[string]any
}

// MintOption changes how Mint builds one token, to produce the invalid
// tokens of the verification test matrix.
type MintOption func(*mintConfig)

type mintConfig struct {
	expired  bool
	issuer   string
	audience string
	otherKey bool
	algNone  bool
}

// Expired makes a token that expired one minute ago: "exp" is now − 1 min and
// "iat" is ExpiresIn before that.
func Expired() MintOption { return func(c *mintConfig) { c.expired = true } }

// WithIssuer sets "iss" to another issuer while signing with this issuer's key.
func WithIssuer(iss string) MintOption { return func(c *mintConfig) { c.issuer = iss } }

// WithAudience sets "aud", overriding Claims.Audience.
func WithAudience(aud string) MintOption { return func(c *mintConfig) { c.audience = aud } }

// SignedByOtherKey signs with a second RSA key that the JWKS does not
// publish, under the published key id: the signature does not verify.
func SignedByOtherKey() MintOption { return func(c *mintConfig) { c.otherKey = true } }

// AlgNone makes an unsigned token with header alg "none" and an empty
// signature.
func AlgNone() MintOption { return func(c *mintConfig) { c.algNone = true } }

// Mint returns a compact JWS (header.payload.signature) carrying c. It fails
// when the issuer URL is not known yet, the subject is empty, ExpiresIn is
// negative, or signing fails.
func (i *Issuer) Mint(c Claims, opts ...MintOption) (string, error) {
	var mc mintConfig
	for _, o := range opts {
		o(&mc)
	}
	iss := i.URL()
	if mc.issuer != "" {
		iss = mc.issuer
	}
	if iss == "" {
		return "", errors.New("devissuer: mint: issuer URL is not known yet (use WithURL, Serve or StartTest)")
	}
	if c.Subject == "" {
		return "", errors.New("devissuer: mint: subject is empty")
	}
	if c.ExpiresIn < 0 {
		return "", fmt.Errorf("devissuer: mint: expiresIn must be >= 0, got %s", c.ExpiresIn)
	}
	life := c.ExpiresIn
	if life == 0 {
		life = DefaultExpiresIn
	}
	aud := c.Audience
	if mc.audience != "" {
		aud = mc.audience
	}
	if aud == "" {
		aud = DefaultAudience
	}
	now := i.now().Truncate(time.Second)
	iat, exp := now, now.Add(life)
	if mc.expired {
		exp = now.Add(-time.Minute)
		iat = exp.Add(-life)
	}
	claims := map[string]any{
		"iss": iss,
		"sub": c.Subject,
		"aud": aud,
		"iat": iat.Unix(),
		"exp": exp.Unix(),
	}
	if c.Username != "" {
		claims["preferred_username"] = c.Username
	}
	if c.Email != "" {
		claims["email"] = c.Email
	}
	if c.Groups != nil {
		claims["groups"] = c.Groups
	}
	for k, v := range c.Extra {
		claims[k] = v
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("devissuer: mint: encode claims: %w", err)
	}
	if mc.algNone {
		enc := base64.RawURLEncoding
		header := enc.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
		return header + "." + enc.EncodeToString(payload) + ".", nil
	}
	key := i.key
	if mc.otherKey {
		if key, err = i.other(); err != nil {
			return "", err
		}
	}
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: i.keyID}},
		(&jose.SignerOptions{}).WithType("JWT"),
	)
	if err != nil {
		return "", fmt.Errorf("devissuer: mint: new signer: %w", err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("devissuer: mint: sign: %w", err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("devissuer: mint: serialize: %w", err)
	}
	return tok, nil
}

// other returns the unpublished second key, generating it on first use.
func (i *Issuer) other() (*rsa.PrivateKey, error) {
	i.otherOnce.Do(func() {
		k, err := rsa.GenerateKey(rand.Reader, rsaBits)
		if err != nil {
			i.otherErr = fmt.Errorf("devissuer: generate other key: %w", err)
			return
		}
		i.otherKey = k
	})
	return i.otherKey, i.otherErr
}
