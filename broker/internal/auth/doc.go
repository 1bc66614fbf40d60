// Package auth authenticates API callers and carries the result, a
// Principal, in the request context.
//
// Authenticators implement one method, Authenticate(ctx, *http.Request).
// They return ErrNoCredentials when the request carries no credentials of
// their kind, so that Chain can try the next one; any other error ends the
// chain. The HTTP layer maps errors in one table:
//
//	ErrNoCredentials, ErrUnauthenticated (*Error) → 401, message = the reason
//	ErrUnavailable                              → 503 (identity provider unreachable)
//
// Authenticators:
//   - HubToken: JupyterHub's static service token, compared in constant time.
//     "Authorization: token <t>" is decisive (a wrong token is refused);
//     "Authorization: Bearer <t>" that does not match falls through to the
//     next authenticator. Put it before Bearer in a Chain.
//   - Bearer: an OIDC access or ID token (a JWT) verified with
//     coreos/go-oidc: signature, issuer, audience and expiry; alg "none" and
//     every algorithm outside BearerConfig's list are refused.
//   - Web (web.go, session.go): the web login. The authorization-code flow
//     with PKCE S256, state and nonce (golang.org/x/oauth2 + go-oidc);
//     server-side sessions in a SessionStore (Redis, through
//     broker/internal/redisstore.Sessions) behind an opaque cookie (HttpOnly,
//     SameSite=Lax, Secure when the public URL is https); a CSRF token per
//     session; logout through the issuer's end_session_endpoint; token
//     refresh once per session across requests (singleflight) and replicas
//     (a lock in the store), which also picks up changed groups. Web is also an
//     Authenticator for requests carrying the session cookie (put it last
//     in a Chain); their unsafe methods need the CSRF token in
//     X-CSRF-Token, else ErrCSRF (403).
//
// Design notes for Web:
//   - Every sign-in failure (state mismatch, replayed callback or code,
//     nonce mismatch, refused code, bad ID token) is a 400 page through
//     Pages.LoginFailed that offers a fresh sign-in; an unreachable issuer
//     or store is a 503 page. The login record is consumed (TakeLogin) before
//     anything else, so a callback succeeds at most once.
//   - A session ends at Created+SessionTTL by the injected clock (Redis's
//     TTL only collects garbage), on logout, and when a refresh is refused.
//     An ended session is an *Error: the pages start a clean sign-in.
//   - Cookie values, states and session ids appear in Redis only as their
//     SHA-256 (broker/api/redisschema builds the keys). Tokens are stored in
//     the session record, never in the cookie, and never logged.
//   - The package imports no Redis client: SessionStore (Logins, Sessions,
//     RefreshLocks) is its own small interface.
//
// Design notes for Bearer:
//   - Discovery is lazy and retried: the broker must start and answer while
//     the identity provider is still starting (dev mode, pods starting before
//     the IdP). The first use runs discovery (oidc.NewProvider) and the first
//     JWKS fetch; success is cached for good, a failure is cached for the
//     retry interval (default 1 s) and then retried. At most one discovery
//     runs at a time; waiters give up when their context ends.
//   - go-oidc's IDTokenVerifier is the authority for signature, issuer,
//     audience and expiry. It is built with oidc.NewVerifier over this
//     package's own key set instead of provider.Verifier, because go-oidc's
//     remote key set flattens its errors to strings: with our own key set a
//     bad signature (401) is told apart from an unreachable JWKS endpoint
//     (503) without matching error texts. The key set refetches the JWKS
//     when a token names an unknown key, at most once per refresh interval
//     (default 10 s), so forged key ids cannot hammer the IdP.
//   - The signature is verified once per request: Bearer verifies it with
//     the key set to classify failures, then passes the verified payload in
//     the context, and the key set hands it to go-oidc's own call for the
//     same token string.
//   - A token that verified is taken again without its checks for up to
//     30 s, never past its own expiry (an LRU of 4,096 entries keyed by the
//     token's SHA-256; the Principal is copied out): clients send the same
//     token with each request, and checking it each time took about 9 % of
//     a replica's CPU in the scale rig. A key removed from the issuer's key
//     set stops its tokens within those 30 s.
//   - Before go-oidc runs, cheap pre-checks on the unverified header and
//     claims (algorithm, issuer) and on the verified claims (audience) turn
//     the failure into a readable reason. They only ever refuse; acceptance
//     is go-oidc's.
//   - Reasons never echo the token, and never echo claim values except the
//     expiry time and a short algorithm name.
//
// Invariants:
//   - A Principal in a context was produced by an Authenticator in this
//     request; nothing else calls WithPrincipal outside tests.
//   - Principal.Admin is true only for a verified token whose groups claim
//     holds the configured admin group; the hub token is never admin.
//
// Everything here is safe for concurrent use.
package auth
