package e2e

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestTokenMatrix sends tokens that must be refused to the running broker
// and checks each gets 401 with a JSON {code, message} and a
// WWW-Authenticate challenge, next to a valid token that must pass (so the
// refusals mean something), the hub service token acting for a named user,
// and a non-admin token that an admin route must refuse with 403.
func TestTokenMatrix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	alice := devissuer.Claims{Subject: "sub-alice", Username: "alice", Groups: []string{"ml"}, Audience: audience}
	mint := func(c devissuer.Claims, opts ...devissuer.MintOption) string {
		t.Helper()
		tok, err := e.issuer.Mint(c, opts...)
		if err != nil {
			t.Fatalf("mint: %v", err)
		}
		return tok
	}
	valid := mint(alice)

	var got v1.Me
	if _, err := (&harness.Client{BaseURL: e.broker.URL, Token: valid}).Do(ctx, http.MethodGet, "/api/v1/me", nil, nil, &got); err != nil {
		t.Fatalf("valid token refused: %v", err)
	}
	if diff := cmp.Diff(v1.Me{User: "alice", Groups: []string{"ml"}}, got); diff != "" {
		t.Errorf("/api/v1/me with a valid token (-want +got):\n%s", diff)
	}

	tests := []struct {
		name   string
		header string // Authorization; "" sends none
	}{
		{name: "no token", header: ""},
		{name: "expired", header: "Bearer " + mint(alice, devissuer.Expired())},
		{name: "wrong audience", header: "Bearer " + mint(alice, devissuer.WithAudience("someone-else"))},
		{name: "wrong issuer", header: "Bearer " + mint(alice, devissuer.WithIssuer("https://issuer.invalid"))},
		{name: "bad signature", header: "Bearer " + mint(alice, devissuer.SignedByOtherKey())},
		{name: "alg none", header: "Bearer " + mint(alice, devissuer.AlgNone())},
		{name: "tampered payload", header: "Bearer " + tamper(t, valid)},
		{name: "not a JWT", header: "Bearer not-a-jwt"},
		{name: "basic scheme", header: "Basic YWxpY2U6cGFzc3dvcmQ="},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.header != "" {
				h.Set("Authorization", tc.header)
			}
			for _, path := range []string{"/api/v1/me", harness.ServerPath("alice", "nb")} {
				cl := &harness.Client{BaseURL: e.broker.URL}
				_, err := cl.Do(ctx, http.MethodGet, path, nil, h, nil)
				wantAPIError(t, "GET "+path, err, http.StatusUnauthorized, v1.CodeUnauthorized)
				var ae *harness.APIError
				if errors.As(err, &ae) && !strings.HasPrefix(ae.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("GET %s: WWW-Authenticate %q, want a Bearer challenge", path, ae.Header.Get("WWW-Authenticate"))
				}
				if errors.As(err, &ae) && !strings.HasPrefix(ae.Header.Get("Content-Type"), "application/json") {
					t.Errorf("GET %s: Content-Type %q, want application/json", path, ae.Header.Get("Content-Type"))
				}
			}
		})
	}

	// The hub service token acts for a named user with the groups it passes;
	// that user then owns the server, and others still get 404.
	hub := &harness.Client{BaseURL: e.broker.URL, Token: e.hubToken}
	var created v1.Server
	status, err := hub.Do(ctx, http.MethodPut, harness.ServerPath("carol", "nb"), v1.CreateServerRequest{Profile: "small"},
		http.Header{"Idempotency-Key": {"hub-1"}, v1.HeaderGroups: {"ml"}}, &created)
	if err != nil || status != http.StatusCreated || created.User != "carol" {
		t.Fatalf("hub creates carol/nb: status %d, server %+v, %v; want 201 for carol", status, created, err)
	}
	if s, err := e.client("carol", "ml").GetServer(ctx, "carol", "nb"); err != nil || s.SpawnID != created.SpawnID {
		t.Errorf("carol gets the server the hub created: %+v, %v", s, err)
	}
	_, err = e.client("dave", "ml").GetServer(ctx, "carol", "nb")
	wantAPIError(t, "dave gets carol's server", err, http.StatusNotFound, v1.CodeNotFound)

	// A valid non-admin token on an admin route: 403, not 401.
	_, err = (&harness.Client{BaseURL: e.broker.URL, Token: valid}).GPUs(ctx)
	wantAPIError(t, "non-admin lists GPUs", err, http.StatusForbidden, v1.CodeForbidden)
}

// tamper changes one claim in the token's payload, keeping the signature.
func tamper(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts", len(parts))
	}
	payload := []byte(parts[1])
	// Flip one base64url character in the middle of the payload: a different
	// payload with a signature made for the original.
	i := len(payload) / 2
	if payload[i] == 'A' {
		payload[i] = 'B'
	} else {
		payload[i] = 'A'
	}
	return parts[0] + "." + string(payload) + "." + parts[2]
}
