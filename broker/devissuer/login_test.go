package devissuer_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/oauth2"

	"github.com/gpubroker/gpubroker/broker/devissuer"
)

const (
	testClient   = "broker"
	testSecret   = "s3cret"
	testRedirect = "http://rp.example/callback"
	testLogout   = "http://rp.example/bye"
)

func startFlow(t *testing.T, opts ...devissuer.Option) (*devissuer.Issuer, *oauth2.Config, *oidc.Provider) {
	t.Helper()
	opts = append([]devissuer.Option{
		devissuer.WithUsers(
			devissuer.User{Username: "alice", Groups: []string{"ml"}},
			devissuer.User{Username: "bob", Groups: []string{"admins"}},
		),
		devissuer.WithClient(devissuer.Client{ID: testClient, Secret: testSecret,
			RedirectURIs: []string{testRedirect}, PostLogoutRedirectURIs: []string{testLogout}}),
	}, opts...)
	iss := devissuer.StartTest(t, opts...)
	p, err := oidc.NewProvider(t.Context(), iss.URL())
	if err != nil {
		t.Fatal(err)
	}
	return iss, &oauth2.Config{ClientID: testClient, ClientSecret: testSecret, Endpoint: p.Endpoint(),
		RedirectURL: testRedirect, Scopes: []string{oidc.ScopeOpenID, "groups"}}, p
}

// noFollow is a client that returns redirects instead of following them.
var noFollow = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// authorize runs GET u and returns the query of the redirect it answers.
func authorize(t *testing.T, u string) url.Values {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("GET %s: status %d, want 302", u, resp.StatusCode)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	return loc.Query()
}

func TestCodeFlowWithPKCENonceAndRefresh(t *testing.T) {
	iss, conf, p := startFlow(t)
	ctx := t.Context()
	verifier := oauth2.GenerateVerifier()
	q := authorize(t, conf.AuthCodeURL("st-1", oauth2.S256ChallengeOption(verifier), oidc.Nonce("n-1"),
		oauth2.SetAuthURLParam("login_hint", "alice")))
	if q.Get("state") != "st-1" || q.Get("code") == "" {
		t.Fatalf("redirect query %v, want state st-1 and a code", q)
	}
	tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := p.VerifierContext(ctx, &oidc.Config{ClientID: testClient}).Verify(ctx, raw)
	if err != nil {
		t.Fatalf("verify id token: %v", err)
	}
	var claims struct {
		Nonce  string   `json:"nonce"`
		User   string   `json:"preferred_username"`
		Groups []string `json:"groups"`
	}
	if err := idt.Claims(&claims); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(struct {
		Nonce  string   `json:"nonce"`
		User   string   `json:"preferred_username"`
		Groups []string `json:"groups"`
	}{"n-1", "alice", []string{"ml"}}, claims); diff != "" {
		t.Errorf("claims (-want +got):\n%s", diff)
	}

	// The code works once; the replay also revokes its refresh token.
	if _, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier)); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Errorf("replayed code: err %v, want invalid_grant already used", err)
	}
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err == nil {
		t.Error("refresh token issued from a replayed code still works")
	}
	if got := iss.Stats(); got.CodeExchanges != 1 {
		t.Errorf("stats %+v, want 1 code exchange", got)
	}
}

func TestRefreshRotatesAndPicksUpGroups(t *testing.T) {
	iss, conf, p := startFlow(t)
	ctx := t.Context()
	verifier := oauth2.GenerateVerifier()
	q := authorize(t, conf.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("login_hint", "bob")))
	tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.SetGroups("bob", []string{"ml", "new"}); err != nil {
		t.Fatal(err)
	}
	fresh, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	if err != nil {
		t.Fatalf("refresh: %v", err)
	}
	raw, _ := fresh.Extra("id_token").(string)
	idt, err := p.VerifierContext(ctx, &oidc.Config{ClientID: testClient}).Verify(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Groups []string `json:"groups"`
		Nonce  string   `json:"nonce"`
	}
	if err := idt.Claims(&c); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ml", "new"}, c.Groups); diff != "" || c.Nonce != "" {
		t.Errorf("refreshed groups (-want +got):\n%s; nonce %q, want none", diff, c.Nonce)
	}
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err == nil {
		t.Error("a used refresh token worked again")
	}
	if fresh.RefreshToken == tok.RefreshToken || fresh.RefreshToken == "" {
		t.Errorf("refresh token not rotated")
	}
}

func TestAuthorizeRefusals(t *testing.T) {
	_, conf, _ := startFlow(t, devissuer.WithAutoApprove("alice"))
	verifier := oauth2.GenerateVerifier()
	tests := []struct {
		name      string
		url       func() string
		wantError string // error parameter in the redirect; "" = 400 page
	}{
		{"no PKCE", func() string { return conf.AuthCodeURL("s") }, "invalid_request"},
		{"plain PKCE", func() string {
			return conf.AuthCodeURL("s", oauth2.SetAuthURLParam("code_challenge", verifier), oauth2.SetAuthURLParam("code_challenge_method", "plain"))
		}, "invalid_request"},
		{"no openid scope", func() string {
			c := *conf
			c.Scopes = []string{"profile"}
			return c.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier))
		}, "invalid_scope"},
		{"unregistered redirect", func() string {
			c := *conf
			c.RedirectURL = "http://evil.example/cb"
			return c.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier))
		}, ""},
		{"unknown client", func() string {
			c := *conf
			c.ClientID = "nobody"
			return c.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier))
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, tc.url(), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := noFollow.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if tc.wantError == "" {
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("status %d, want 400 without redirect", resp.StatusCode)
				}
				return
			}
			loc, _ := url.Parse(resp.Header.Get("Location"))
			if got := loc.Query().Get("error"); got != tc.wantError || loc.Query().Get("state") != "s" {
				t.Errorf("redirect %s: error %q, want %q with state s", loc, got, tc.wantError)
			}
		})
	}
}

func TestWrongVerifierAndFormLogin(t *testing.T) {
	_, conf, _ := startFlow(t)
	ctx := t.Context()
	verifier := oauth2.GenerateVerifier()
	// No auto-approve and no hint: the form lists the users.
	u := conf.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("form: status %d", resp.StatusCode)
	}
	parsed, _ := url.Parse(u)
	form := parsed.Query()
	form.Set("username", "bob")
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, parsed.Scheme+"://"+parsed.Host+devissuer.AuthorizePath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	code := loc.Query().Get("code")
	if code == "" {
		t.Fatalf("form post: redirect %s has no code", loc)
	}
	if _, err := conf.Exchange(ctx, code, oauth2.VerifierOption(oauth2.GenerateVerifier())); err == nil {
		t.Error("exchange with the wrong verifier succeeded")
	}
}

func TestEndSessionRevokesAndRedirects(t *testing.T) {
	iss, conf, _ := startFlow(t, devissuer.WithAutoApprove("alice"))
	ctx := t.Context()
	verifier := oauth2.GenerateVerifier()
	q := authorize(t, conf.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier)))
	tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatal(err)
	}
	v := url.Values{"id_token_hint": {tok.Extra("id_token").(string)}, "post_logout_redirect_uri": {testLogout}, "state": {"x"}}
	got := authorize(t, iss.URL()+devissuer.EndSessionPath+"?"+v.Encode())
	if got.Get("state") != "x" {
		t.Errorf("logout redirect query %v, want state x", got)
	}
	if _, err := conf.TokenSource(context.WithoutCancel(ctx), &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err == nil {
		t.Error("refresh token works after logout")
	}
}
