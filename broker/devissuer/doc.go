// Package devissuer is a small, real OpenID Connect issuer that runs inside a
// Go process. It signs real RS256 tokens with a freshly generated RSA key and
// serves the discovery document and the JWKS that go-oidc needs, so the
// broker's bearer-token verification runs unchanged against it.
//
// It is for dev mode (`gpubroker-dev`) and for tests only, never for
// production: it authenticates nobody, mints whatever claims it is asked for,
// and its key lives only in memory.
//
// Design notes:
//   - The issuer URL must be known before a token is minted, because it is
//     the "iss" claim. Give it up front with WithURL (dev mode, where the
//     listener is opened first), or let Serve or StartTest set it from the
//     listener's address.
//   - Lifecycle: Serve(ctx, l) blocks until ctx is done and then shuts the
//     HTTP server down, so the caller owns the goroutine (errgroup). StartTest
//     uses httptest and closes the server in tb.Cleanup. New starts nothing.
//   - Handler serves /.well-known/openid-configuration and /keys, and the
//     authorization-code flow (login.go): /authorize signs in a configured
//     user without a password (the auto-approved one, the one a login_hint
//     names, or the one picked on its form), /token exchanges codes (PKCE
//     S256 required, codes single use: a replayed code is refused and the
//     refresh token issued from it revoked) and rotates refresh tokens
//     (each one works once; a refresh picks up the user's current groups),
//     and /logout is the end-session endpoint. Clients must be registered
//     (WithClient) and redirect URIs match exactly.
//   - Mint builds the "token matrix" used by the auth tests: Expired,
//     WithIssuer, WithAudience, SignedByOtherKey (same key id, other key) and
//     AlgNone (an unsigned token with alg "none").
//
// An *Issuer is safe for concurrent use.
package devissuer
