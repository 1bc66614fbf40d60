package frontend

import (
	"crypto/rand"
	"net/http"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// notebookData is the data of the page for a notebook that cannot be
// opened now.
type notebookData struct {
	S       v1.Server
	Owner   bool   // the viewer owns the server (may start it)
	Problem string // an extra sentence ("" none)
	Step    int
	Steps   int
	Live    bool // starting: follow the events, load again on each, so enter when running
	// UpdatedMS is the record's last change (Unix ms): the stream's events
	// up to it are already on the page.
	UpdatedMS int64
	Events    string
	API       string
	Here      string // this page's path, to come back to after a start
	CSRF      string
	Idem      string
}

// Notebook answers status with the page of server (user, name) for a
// browser that asked for the notebook itself: stopped (with a button that
// starts it again and comes back here), starting (following the spawn's
// progress and entering the notebook once it runs), or running but not
// answering, with problem as an extra sentence. It implements the notebook
// proxy's Pages.
func (h *Handler) Notebook(w http.ResponseWriter, r *http.Request, status int, user, name, problem string) {
	h.page(false, func(w http.ResponseWriter, r *http.Request, v Viewer) {
		s, err := h.api.serverOf(r.Context(), r, v, user, name)
		if err != nil {
			h.apiFailed(w, r, v, err)
			return
		}
		here := r.URL.Path
		if !strings.HasPrefix(here, "/user/") {
			here = ""
		}
		d := notebookData{S: s, Owner: v.User == user, Problem: problem, Step: stepOf(s.State), Steps: len(spawnSteps), UpdatedMS: s.UpdatedAt.UnixMilli(),
			Events: serverPath(user, name) + "/events", API: serverPath(user, name), Here: here, CSRF: v.CSRF, Idem: rand.Text()}
		switch s.State {
		case v1.StateStopped, v1.StateFailed:
		case v1.StateRunning:
			d.Live = problem == "" // the proxy passes it through now: reload
		default:
			d.Live = true
		}
		h.render(w, r, status, "notebook", view{Title: "Notebook " + s.Name, Nav: "servers", Viewer: &v, Data: d})
	})(w, r)
}

// Error answers status with a page saying msg. It implements the notebook
// proxy's Pages.
func (h *Handler) Error(w http.ResponseWriter, r *http.Request, status int, msg string) {
	var vp *Viewer
	if v, err := h.deps.Sessions.Viewer(r.Context(), r); err == nil {
		vp = &v
	}
	h.errorPage(w, r, vp, status, msg)
}
