package auth

import (
	"context"
	"log/slog"
	"slices"
)

// Principal is an authenticated caller.
type Principal struct {
	// Subject is the token's "sub" claim; "" for the hub token.
	Subject string
	// User is the user name from the configured username claim, or
	// HubUser for the hub token. Never empty in an authenticated Principal.
	User string
	// Groups are the caller's groups from the configured groups claim,
	// sorted and without duplicates; nil when the token carries none.
	Groups []string
	// Admin is true for members of the configured admin group.
	Admin bool
	// Hub is true for JupyterHub's service token, which may act for a
	// named user.
	Hub bool
}

// clone is p with a Groups slice of its own.
func (p Principal) clone() Principal {
	p.Groups = slices.Clone(p.Groups)
	return p
}

// CanActFor reports whether p may act on user's servers: its own, or any
// user's when p is an admin or the hub token. Callers answer 404, not 403,
// when it is false, so that other users' servers stay invisible.
func (p Principal) CanActFor(user string) bool {
	return p.Admin || p.Hub || (p.User != "" && p.User == user)
}

// LogValue prints only the user name, so that logging a Principal never
// leaks subjects or group memberships.
func (p Principal) LogValue() slog.Value { return slog.StringValue(p.User) }

// principalKey is the context key for a Principal.
type principalKey struct{}

// WithPrincipal returns a copy of ctx that carries p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the Principal that ctx carries, and whether it
// carries one.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
