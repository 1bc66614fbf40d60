package proxy

// The proxy's own answers when it does not forward: JSON errors for API
// clients, pages for a browser, redirects to sign in.

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// plain answers a non-page request with status and a short JSON error in
// the API's shape.
func plain(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "{\"code\":%q,\"message\":%q}\n", code, msg)
}

// loginRedirect sends a browser to the web login, coming back to r's URL
// on the broker's origin.
func (p *Proxy) loginRedirect(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, p.public.String()+auth.LoginPath+"?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
}

// refuse answers a request without (valid) credentials: a sign-in for a
// browser, 401 otherwise. A lookup that failed (the identity provider or
// Redis cannot be reached: anything but a refused or missing credential)
// is 503, never a sign-in: signing in again would not help.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, auth.ErrUnauthenticated) {
		if !errors.Is(err, auth.ErrUnavailable) {
			p.log.WarnContext(r.Context(), "notebook proxy: session lookup failed", "err", err)
		}
		plain(w, http.StatusServiceUnavailable, "unavailable", "signing in is unavailable right now; try again in a few seconds")
		return
	}
	if wantsPage(r) {
		p.loginRedirect(w, r)
		return
	}
	msg := "sign in first, or send Authorization: Bearer <token>"
	var ae *auth.Error
	if errors.As(err, &ae) && !errors.Is(err, auth.ErrNoCredentials) {
		msg = ae.Reason
	}
	plain(w, http.StatusUnauthorized, "unauthenticated", msg)
}

// notFound answers a notebook that does not exist or is not the caller's.
func (p *Proxy) notFound(w http.ResponseWriter, r *http.Request) {
	if wantsPage(r) {
		p.deps.Pages.Error(w, r, http.StatusNotFound, "There is no notebook server at this address, or it is not yours.")
		return
	}
	plain(w, http.StatusNotFound, "not_found", "there is no such notebook server")
}

// notRunning answers a request for a server that is not running: its page
// for a browser, 503 otherwise.
func (p *Proxy) notRunning(w http.ResponseWriter, r *http.Request, srv fleet.Server) {
	if wantsPage(r) {
		p.deps.Pages.Notebook(w, r, http.StatusOK, srv.User, srv.Name, "")
		return
	}
	plain(w, http.StatusServiceUnavailable, "not_running", "the notebook server is "+string(srv.State))
}

// unavailable answers a failure to read what the proxy needs.
func (p *Proxy) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	p.log.WarnContext(r.Context(), "notebook proxy: lookup failed", "err", err)
	plain(w, http.StatusServiceUnavailable, "unavailable", "the notebook cannot be looked up right now; try again in a few seconds")
}
