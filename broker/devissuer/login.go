package devissuer

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// CodeTTL is how long an authorization code may be exchanged.
const CodeTTL = time.Minute

// User is an identity the issuer signs in without a password.
type User struct {
	// Subject is the "sub" claim; "" means "sub-" + Username.
	Subject string
	// Username is the "preferred_username" claim and the name a login_hint
	// or the login form uses; required and unique.
	Username string
	// Email is the "email" claim; omitted when empty.
	Email string
	// Groups is the "groups" claim at sign-in; SetGroups changes it for
	// later refreshes.
	Groups []string
}

// Client is a registered relying party.
type Client struct {
	// ID is the client id, the "aud" of its tokens; required.
	ID string
	// Secret is the client secret; "" makes a public client (PKCE only).
	Secret string
	// RedirectURIs are the exact redirect URIs /authorize accepts.
	RedirectURIs []string
	// PostLogoutRedirectURIs are the exact URIs /logout sends the browser
	// back to.
	PostLogoutRedirectURIs []string
}

// Stats counts the flow's successful requests, for tests (single-flight
// refresh, replay). Zero at start.
type Stats struct {
	Authorizations int // codes issued by /authorize
	CodeExchanges  int // codes exchanged by /token
	Refreshes      int // refresh-token grants
	Logouts        int // end-session requests
}

// WithUsers adds users that /authorize may sign in.
func WithUsers(users ...User) Option {
	return func(i *Issuer) {
		for _, u := range users {
			if u.Subject == "" {
				u.Subject = "sub-" + u.Username
			}
			u.Groups = slices.Clone(u.Groups)
			i.login.users[u.Username] = &u
			i.login.order = append(i.login.order, u.Username)
		}
	}
}

// WithAutoApprove makes /authorize sign in the user named username at once
// when the request has no login_hint (dev mode's one-click login). Without
// it, /authorize shows a form listing the users.
func WithAutoApprove(username string) Option {
	return func(i *Issuer) { i.login.autoApprove = username }
}

// WithClient registers a client.
func WithClient(c Client) Option {
	return func(i *Issuer) {
		c.RedirectURIs = slices.Clone(c.RedirectURIs)
		i.login.clients[c.ID] = &c
	}
}

// loginState is the flow's in-memory state, guarded by mu.
type loginState struct {
	mu          sync.Mutex
	users       map[string]*User
	order       []string
	clients     map[string]*Client
	autoApprove string
	codes       map[string]*grant // by code; kept after use to detect replays
	refresh     map[string]*grant // by refresh token
	stats       Stats
}

// grant is what a code or refresh token stands for.
type grant struct {
	client    string
	redirect  string
	user      string
	nonce     string
	challenge string
	expires   time.Time
	used      bool   // codes: exchanged once already
	refresh   string // codes: the refresh token issued from it
}

func (s *loginState) init() {
	s.users = map[string]*User{}
	s.clients = map[string]*Client{}
	s.codes = map[string]*grant{}
	s.refresh = map[string]*grant{}
}

// SetGroups replaces the groups of user username; the next refresh-token
// grant puts them in the new tokens. It fails for an unknown user.
func (i *Issuer) SetGroups(username string, groups []string) error {
	i.login.mu.Lock()
	defer i.login.mu.Unlock()
	u, ok := i.login.users[username]
	if !ok {
		return fmt.Errorf("devissuer: unknown user %q", username)
	}
	u.Groups = slices.Clone(groups)
	return nil
}

// Stats returns the counts of successful flow requests so far.
func (i *Issuer) Stats() Stats {
	i.login.mu.Lock()
	defer i.login.mu.Unlock()
	return i.login.stats
}

var chooseTmpl = template.Must(template.New("choose").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in — gpubroker dev issuer</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:30rem;margin:3rem auto;padding:0 1rem}
button{font:inherit;padding:.5rem 1rem;margin:.25rem 0;width:100%;text-align:left;cursor:pointer}</style></head>
<body><main><h1>Sign in</h1>
<p>This is the development OIDC issuer: pick a user, no password needed.</p>
<form method="post" action="{{.Action}}">
{{range $k, $v := .Params}}<input type="hidden" name="{{$k}}" value="{{$v}}">
{{end}}{{range .Users}}<button type="submit" name="username" value="{{.Username}}">{{.Username}}{{if .Groups}} <small>({{range $i, $g := .Groups}}{{if $i}}, {{end}}{{$g}}{{end}})</small>{{end}}</button>
{{end}}</form></main></body></html>
`))

// serveAuthorize handles GET and POST /authorize. Errors that make the
// redirect URI untrustworthy (unknown client, unregistered redirect URI)
// are shown as a page; every other error is sent back to the client as
// error and error_description parameters, as RFC 6749 §4.1.2.1 says.
func (i *Issuer) serveAuthorize(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	q := r.Form
	i.login.mu.Lock()
	c, ok := i.login.clients[q.Get("client_id")]
	i.login.mu.Unlock()
	if !ok {
		http.Error(w, "unknown client_id", http.StatusBadRequest)
		return
	}
	redirect := q.Get("redirect_uri")
	if !slices.Contains(c.RedirectURIs, redirect) {
		http.Error(w, "redirect_uri is not registered for this client", http.StatusBadRequest)
		return
	}
	fail := func(code, desc string) {
		u, _ := url.Parse(redirect) // registered, so it parses
		v := u.Query()
		v.Set("error", code)
		v.Set("error_description", desc)
		if s := q.Get("state"); s != "" {
			v.Set("state", s)
		}
		u.RawQuery = v.Encode()
		http.Redirect(w, r, u.String(), http.StatusFound)
	}
	switch {
	case q.Get("response_type") != "code":
		fail("unsupported_response_type", "only response_type=code is supported")
		return
	case !slices.Contains(strings.Fields(q.Get("scope")), "openid"):
		fail("invalid_scope", "the openid scope is required")
		return
	case q.Get("code_challenge") == "" || q.Get("code_challenge_method") != "S256":
		fail("invalid_request", "PKCE with code_challenge_method=S256 is required")
		return
	}
	username := q.Get("username") // the form's choice
	if username == "" {
		username = q.Get("login_hint")
	}
	if username == "" {
		username = i.login.autoApprove
	}
	i.login.mu.Lock()
	_, known := i.login.users[username]
	var users []User
	for _, n := range i.login.order {
		users = append(users, *i.login.users[n])
	}
	i.login.mu.Unlock()
	if !known {
		params := map[string]string{}
		for _, k := range []string{"client_id", "redirect_uri", "response_type", "scope", "state", "nonce", "code_challenge", "code_challenge_method"} {
			params[k] = q.Get(k)
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		// A write error means the browser went away.
		_ = chooseTmpl.Execute(w, map[string]any{"Action": AuthorizePath, "Params": params, "Users": users})
		return
	}
	code := rand.Text()
	i.login.mu.Lock()
	i.login.codes[code] = &grant{
		client: c.ID, redirect: redirect, user: username, nonce: q.Get("nonce"),
		challenge: q.Get("code_challenge"), expires: i.now().Add(CodeTTL),
	}
	i.login.stats.Authorizations++
	i.login.mu.Unlock()
	u, _ := url.Parse(redirect)
	v := u.Query()
	v.Set("code", code)
	if s := q.Get("state"); s != "" {
		v.Set("state", s)
	}
	u.RawQuery = v.Encode()
	http.Redirect(w, r, u.String(), http.StatusFound)
}

// tokenError is an RFC 6749 §5.2 error answer.
type tokenError struct {
	status int
	code   string
	desc   string
}

func (e *tokenError) Error() string { return e.code + ": " + e.desc }

func invalidGrant(desc string) error {
	return &tokenError{http.StatusBadRequest, "invalid_grant", desc}
}

// tokenResponse is the body of a successful /token answer.
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	RefreshToken string `json:"refresh_token"`
	IDToken      string `json:"id_token"`
	Scope        string `json:"scope"`
}

// serveToken handles POST /token: authorization_code and refresh_token.
func (i *Issuer) serveToken(w http.ResponseWriter, r *http.Request) {
	resp, err := i.token(r)
	var te *tokenError
	switch {
	case errors.As(err, &te):
		writeJSON(w, te.status, map[string]string{"error": te.code, "error_description": te.desc})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "server_error", "error_description": err.Error()})
	default:
		writeJSON(w, http.StatusOK, resp)
	}
}

func (i *Issuer) token(r *http.Request) (tokenResponse, error) {
	if err := r.ParseForm(); err != nil {
		return tokenResponse{}, &tokenError{http.StatusBadRequest, "invalid_request", "the form does not parse"}
	}
	c, err := i.clientAuth(r)
	if err != nil {
		return tokenResponse{}, err
	}
	now := i.now()
	i.login.mu.Lock()
	defer i.login.mu.Unlock()
	var g grant
	switch r.PostForm.Get("grant_type") {
	case "authorization_code":
		code := r.PostForm.Get("code")
		stored, ok := i.login.codes[code]
		switch {
		case !ok:
			return tokenResponse{}, invalidGrant("unknown authorization code")
		case stored.used:
			// RFC 6749 §4.1.2: a replayed code revokes what it gave.
			delete(i.login.refresh, stored.refresh)
			return tokenResponse{}, invalidGrant("the authorization code was already used")
		case now.After(stored.expires):
			return tokenResponse{}, invalidGrant("the authorization code expired")
		case stored.client != c.ID:
			return tokenResponse{}, invalidGrant("the authorization code was issued to another client")
		case stored.redirect != r.PostForm.Get("redirect_uri"):
			return tokenResponse{}, invalidGrant("redirect_uri differs from the authorization request's")
		}
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		if subtle.ConstantTimeCompare([]byte(base64.RawURLEncoding.EncodeToString(sum[:])), []byte(stored.challenge)) != 1 {
			return tokenResponse{}, invalidGrant("code_verifier does not match the code_challenge")
		}
		stored.used = true
		g = *stored
		i.login.stats.CodeExchanges++
	case "refresh_token":
		rt := r.PostForm.Get("refresh_token")
		stored, ok := i.login.refresh[rt]
		if !ok || stored.client != c.ID {
			return tokenResponse{}, invalidGrant("unknown or already used refresh token")
		}
		delete(i.login.refresh, rt) // rotation: each refresh token works once
		g = *stored
		g.nonce = "" // only the ID token of the code exchange carries the nonce
		i.login.stats.Refreshes++
	default:
		return tokenResponse{}, &tokenError{http.StatusBadRequest, "unsupported_grant_type", "grant_type must be authorization_code or refresh_token"}
	}
	u, ok := i.login.users[g.user]
	if !ok {
		return tokenResponse{}, invalidGrant("the user no longer exists")
	}
	claims := Claims{Subject: u.Subject, Username: u.Username, Email: u.Email, Groups: slices.Clone(u.Groups),
		Audience: c.ID, ExpiresIn: DefaultExpiresIn}
	if claims.Groups == nil {
		claims.Groups = []string{}
	}
	access, err := i.Mint(claims)
	if err != nil {
		return tokenResponse{}, err
	}
	if g.nonce != "" {
		claims.Extra = map[string]any{"nonce": g.nonce}
	}
	id, err := i.Mint(claims)
	if err != nil {
		return tokenResponse{}, err
	}
	rt := rand.Text()
	i.login.refresh[rt] = &grant{client: c.ID, user: g.user}
	if code := r.PostForm.Get("code"); code != "" && r.PostForm.Get("grant_type") == "authorization_code" {
		i.login.codes[code].refresh = rt
	}
	return tokenResponse{
		AccessToken: access, TokenType: "Bearer", ExpiresIn: int64(DefaultExpiresIn / time.Second),
		RefreshToken: rt, IDToken: id, Scope: "openid profile email groups",
	}, nil
}

// clientAuth authenticates the client with HTTP Basic or form fields;
// public clients send only client_id.
func (i *Issuer) clientAuth(r *http.Request) (*Client, error) {
	id, secret, basic := r.BasicAuth()
	if basic {
		// RFC 6749 §2.3.1: Basic credentials are form-urlencoded.
		id, _ = url.QueryUnescape(id)
		secret, _ = url.QueryUnescape(secret)
	} else {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	i.login.mu.Lock()
	c, ok := i.login.clients[id]
	i.login.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare([]byte(c.Secret), []byte(secret)) != 1 {
		return nil, &tokenError{http.StatusUnauthorized, "invalid_client", "unknown client or wrong secret"}
	}
	return c, nil
}

var signedOutTmpl = template.Must(template.New("out").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Signed out — gpubroker dev issuer</title></head>
<body><main><h1>Signed out</h1><p>You are signed out of the development issuer.</p></main></body></html>
`))

// serveEndSession handles GET /logout (RP-initiated logout): it revokes the
// refresh tokens of the id_token_hint's user for its client and sends the
// browser to post_logout_redirect_uri when that is registered.
func (i *Issuer) serveEndSession(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var hint struct {
		Subject  string `json:"sub"`
		Audience string `json:"aud"`
	}
	if parts := strings.Split(q.Get("id_token_hint"), "."); len(parts) == 3 {
		// The hint is our own token; its signature does not matter for
		// revoking, which only ever takes rights away.
		if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err == nil {
			_ = json.Unmarshal(b, &hint)
		}
	}
	i.login.mu.Lock()
	i.login.stats.Logouts++
	for rt, g := range i.login.refresh {
		if u, ok := i.login.users[g.user]; ok && u.Subject == hint.Subject && g.client == hint.Audience {
			delete(i.login.refresh, rt)
		}
	}
	client := i.login.clients[hint.Audience]
	if client == nil {
		client = i.login.clients[q.Get("client_id")]
	}
	i.login.mu.Unlock()
	if back := q.Get("post_logout_redirect_uri"); back != "" && client != nil && slices.Contains(client.PostLogoutRedirectURIs, back) {
		u, _ := url.Parse(back)
		if s := q.Get("state"); s != "" {
			v := u.Query()
			v.Set("state", s)
			u.RawQuery = v.Encode()
		}
		http.Redirect(w, r, u.String(), http.StatusFound)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = signedOutTmpl.Execute(w, nil)
}
