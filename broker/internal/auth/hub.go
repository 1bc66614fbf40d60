package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// HubUser is Principal.User for the JupyterHub service token.
const HubUser = "jupyterhub"

// HubToken authenticates JupyterHub's static service token. The zero value
// and a HubToken made from "" are disabled: they return ErrNoCredentials for
// every request. Safe for concurrent use.
type HubToken struct {
	sum     [sha256.Size]byte
	enabled bool
}

var _ Authenticator = (*HubToken)(nil)

// NewHubToken returns an authenticator for token; "" disables it. Only a
// SHA-256 digest of the token is kept, and comparisons are constant-time and
// independent of the token's length.
func NewHubToken(token string) *HubToken {
	if token == "" {
		return &HubToken{}
	}
	return &HubToken{sum: sha256.Sum256([]byte(token)), enabled: true}
}

// Authenticate accepts "Authorization: token <t>" (JupyterHub's scheme) and
// "Authorization: Bearer <t>" when t is the hub token, returning
// Principal{User: HubUser, Hub: true}. A wrong token under the "token"
// scheme is refused with an *Error; any other request, including a Bearer
// token that is not the hub token, gets ErrNoCredentials so that the next
// authenticator may try.
func (h *HubToken) Authenticate(_ context.Context, r *http.Request) (Principal, error) {
	if !h.enabled {
		return Principal{}, ErrNoCredentials
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok {
		return Principal{}, ErrNoCredentials
	}
	tok = strings.TrimSpace(tok)
	sum := sha256.Sum256([]byte(tok))
	match := subtle.ConstantTimeCompare(sum[:], h.sum[:]) == 1
	switch {
	case match && (strings.EqualFold(scheme, "token") || strings.EqualFold(scheme, "bearer")):
		return Principal{User: HubUser, Hub: true}, nil
	case strings.EqualFold(scheme, "token"):
		return Principal{}, &Error{Reason: "the JupyterHub service token is not valid"}
	default:
		return Principal{}, ErrNoCredentials
	}
}
