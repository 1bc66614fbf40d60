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
//   - The web-login session authenticator (cookie → Redis session →
//     Principal) is a third Authenticator added to the Chain later.
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
