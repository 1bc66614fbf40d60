package auth

import (
	"context"
	"errors"
	"net/http"
)

// ErrUnauthenticated matches every *Error: the caller's credentials were
// refused. The HTTP layer answers 401 with the *Error's Reason.
var ErrUnauthenticated = errors.New("auth: unauthenticated")

// ErrNoCredentials means the request carries no credentials that the
// authenticator understands; the next authenticator in a Chain may try. It
// also matches ErrUnauthenticated (the answer is 401 if nobody accepts).
var ErrNoCredentials error = &Error{Reason: "the request carries no credentials; send an Authorization: Bearer <token> header"}

// ErrUnavailable means the identity provider (discovery or JWKS) cannot be
// reached, so no token can be verified now. The HTTP layer answers 503; the
// Bearer retries on later requests.
var ErrUnavailable = errors.New("auth: the identity provider cannot be reached")

// Error is a refused credential with a reason a person understands, for
// example "token expired at 2026-11-29T15:04:05Z". The reason never contains
// the token. It matches ErrUnauthenticated.
type Error struct {
	Reason string
}

// Error returns "unauthenticated: " and the reason.
func (e *Error) Error() string { return "unauthenticated: " + e.Reason }

// Is makes errors.Is(err, ErrUnauthenticated) true.
func (e *Error) Is(target error) bool { return target == ErrUnauthenticated }

// Authenticator turns a request's credentials into a Principal. It returns
// ErrNoCredentials when the request has no credentials of its kind, an error
// matching ErrUnauthenticated when they are refused, and ErrUnavailable (or
// a context error) when it cannot decide now.
type Authenticator interface {
	Authenticate(ctx context.Context, r *http.Request) (Principal, error)
}

// Chain returns an Authenticator that asks each of as in order and returns
// the first answer that is not ErrNoCredentials. With no authenticators, or
// when all skip, it returns ErrNoCredentials.
func Chain(as ...Authenticator) Authenticator { return chain(as) }

type chain []Authenticator

func (c chain) Authenticate(ctx context.Context, r *http.Request) (Principal, error) {
	for _, a := range c {
		p, err := a.Authenticate(ctx, r)
		if errors.Is(err, ErrNoCredentials) {
			continue
		}
		return p, err
	}
	return Principal{}, ErrNoCredentials
}
