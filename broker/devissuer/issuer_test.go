package devissuer_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/broker/devissuer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var fixedNow = time.Date(2026, 11, 29, 15, 4, 5, 0, time.UTC)

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET %s: decode %q: %v", url, body, err)
		}
	}
	return resp.StatusCode
}

func TestDiscoveryDocument(t *testing.T) {
	iss := devissuer.StartTest(t)
	var got map[string]any
	if code := getJSON(t, iss.URL()+devissuer.DiscoveryPath, &got); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	u := iss.URL()
	want := map[string]any{
		"issuer":                                u,
		"jwks_uri":                              u + "/keys",
		"authorization_endpoint":                u + "/authorize",
		"token_endpoint":                        u + "/token",
		"id_token_signing_alg_values_supported": []any{"RS256"},
	}
	for k, w := range want {
		if diff := cmp.Diff(w, got[k]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", k, diff)
		}
	}
}

// decode returns the header and payload of a compact JWS without verifying it.
func decode(t *testing.T, tok string) (header, payload map[string]any) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts, want 3", len(parts))
	}
	for i, dst := range []*map[string]any{&header, &payload} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		if err := json.Unmarshal(b, dst); err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
	}
	return header, payload
}

func TestMintClaims(t *testing.T) {
	iss := devissuer.StartTest(t, devissuer.WithClock(func() time.Time { return fixedNow }))
	base := devissuer.Claims{Subject: "sub-1", Username: "alice", Email: "a@example.com", Groups: []string{"ml"}, Audience: "broker"}
	u := iss.URL()
	now := float64(fixedNow.Unix())
	tests := []struct {
		name   string
		claims devissuer.Claims
		opts   []devissuer.MintOption
		want   map[string]any
	}{
		{
			name:   "all identity claims and a one hour lifetime",
			claims: base,
			want: map[string]any{"iss": u, "sub": "sub-1", "aud": "broker", "iat": now, "exp": now + 3600,
				"preferred_username": "alice", "email": "a@example.com", "groups": []any{"ml"}},
		},
		{
			name:   "defaults for audience and lifetime, empty claims omitted",
			claims: devissuer.Claims{Subject: "s"},
			want:   map[string]any{"iss": u, "sub": "s", "aud": "gpubroker", "iat": now, "exp": now + 3600},
		},
		{
			name:   "expired one minute ago",
			claims: devissuer.Claims{Subject: "s", ExpiresIn: 10 * time.Minute},
			opts:   []devissuer.MintOption{devissuer.Expired()},
			want:   map[string]any{"iss": u, "sub": "s", "aud": "gpubroker", "iat": now - 660, "exp": now - 60},
		},
		{
			name:   "other issuer and audience",
			claims: devissuer.Claims{Subject: "s", Audience: "broker"},
			opts:   []devissuer.MintOption{devissuer.WithIssuer("https://evil.example"), devissuer.WithAudience("other")},
			want:   map[string]any{"iss": "https://evil.example", "sub": "s", "aud": "other", "iat": now, "exp": now + 3600},
		},
		{
			name:   "extra claims override",
			claims: devissuer.Claims{Subject: "s", Groups: []string{"a"}, Extra: map[string]any{"groups": "solo", "upn": "bob"}},
			want:   map[string]any{"iss": u, "sub": "s", "aud": "gpubroker", "iat": now, "exp": now + 3600, "groups": "solo", "upn": "bob"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := iss.Mint(tc.claims, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			header, got := decode(t, tok)
			if header["alg"] != "RS256" || header["kid"] == "" {
				t.Errorf("header = %v, want alg RS256 and a kid", header)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("claims (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMintAlgNoneIsUnsigned(t *testing.T) {
	iss := devissuer.StartTest(t)
	tok, err := iss.Mint(devissuer.Claims{Subject: "s"}, devissuer.AlgNone())
	if err != nil {
		t.Fatal(err)
	}
	header, _ := decode(t, tok)
	if diff := cmp.Diff(map[string]any{"alg": "none", "typ": "JWT"}, header); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	if !strings.HasSuffix(tok, ".") {
		t.Errorf("token %q has a signature", tok)
	}
}

// TestSignatureAgainstJWKS checks the published key verifies normal tokens
// and does not verify SignedByOtherKey tokens, though the key ids match.
func TestSignatureAgainstJWKS(t *testing.T) {
	iss := devissuer.StartTest(t)
	var set jose.JSONWebKeySet
	if code := getJSON(t, iss.URL()+devissuer.KeysPath, &set); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if len(set.Keys) != 1 || !set.Keys[0].IsPublic() {
		t.Fatalf("JWKS = %+v, want one public key", set.Keys)
	}
	for _, tc := range []struct {
		name   string
		opts   []devissuer.MintOption
		wantOK bool
	}{
		{"own key verifies", nil, true},
		{"other key does not", []devissuer.MintOption{devissuer.SignedByOtherKey()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := iss.Mint(devissuer.Claims{Subject: "s"}, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			jws, err := jose.ParseSignedCompact(tok, []jose.SignatureAlgorithm{jose.RS256})
			if err != nil {
				t.Fatal(err)
			}
			if kid := jws.Signatures[0].Header.KeyID; kid != set.Keys[0].KeyID {
				t.Errorf("kid %q, want %q", kid, set.Keys[0].KeyID)
			}
			_, err = jws.Verify(set.Keys[0])
			if gotOK := err == nil; gotOK != tc.wantOK {
				t.Errorf("verified = %v (err %v), want %v", gotOK, err, tc.wantOK)
			}
		})
	}
}

// TestGoOIDCAcceptsTokens is the contract with the broker: go-oidc discovery
// and verification work against the issuer.
func TestGoOIDCAcceptsTokens(t *testing.T) {
	iss := devissuer.StartTest(t)
	p, err := oidc.NewProvider(t.Context(), iss.URL())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.Mint(devissuer.Claims{Subject: "s", Audience: "broker"})
	if err != nil {
		t.Fatal(err)
	}
	idt, err := p.VerifierContext(t.Context(), &oidc.Config{ClientID: "broker"}).Verify(t.Context(), tok)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if idt.Subject != "s" {
		t.Errorf("subject %q, want s", idt.Subject)
	}
}

func TestServeSetsURLAndStopsOnCancel(t *testing.T) {
	iss, err := devissuer.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Mint(devissuer.Claims{Subject: "s"}); err == nil {
		t.Error("Mint before the URL is known succeeded, want an error")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- iss.Serve(ctx, l) }()
	want := "http://" + l.Addr().String()
	var doc map[string]any
	// The listener is open before Serve runs, so the request waits in the
	// accept queue until Serve accepts it; no polling needed.
	if code := getJSON(t, want+devissuer.DiscoveryPath, &doc); code != http.StatusOK || doc["issuer"] != want {
		t.Errorf("discovery: status %d, issuer %v, want 200 and %s", code, doc["issuer"], want)
	}
	if iss.URL() != want {
		t.Errorf("URL() = %q, want %q", iss.URL(), want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve returned %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestServeKeepsConfiguredURL(t *testing.T) {
	iss, err := devissuer.New(devissuer.WithURL("http://dev.example:5556/"))
	if err != nil {
		t.Fatal(err)
	}
	if got := iss.URL(); got != "http://dev.example:5556" {
		t.Errorf("URL() = %q, want trailing slash removed", got)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := iss.Serve(ctx, l); err != nil {
		t.Errorf("Serve with a cancelled context = %v, want nil", err)
	}
	if got := iss.URL(); got != "http://dev.example:5556" {
		t.Errorf("URL() after Serve = %q, want the configured one", got)
	}
}

func TestNewRefusesBadURL(t *testing.T) {
	for _, u := range []string{"ftp://x", "not a url", "/relative"} {
		if _, err := devissuer.New(devissuer.WithURL(u)); err == nil {
			t.Errorf("New(WithURL(%q)) succeeded, want an error", u)
		}
	}
}

func TestMintRefusesBadClaims(t *testing.T) {
	iss := devissuer.StartTest(t)
	for _, c := range []devissuer.Claims{{}, {Subject: "s", ExpiresIn: -time.Second}} {
		if _, err := iss.Mint(c); err == nil {
			t.Errorf("Mint(%+v) succeeded, want an error", c)
		}
	}
}
