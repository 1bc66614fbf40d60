package frontend

import (
	"crypto/rand"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// ---- my servers ----

// launchForm is the launch form's state.
type launchForm struct {
	Name    string
	Profile string
	// Idem is the form's idempotency key: posting the same form twice
	// (a double click, a retry) starts one server.
	Idem string
}

type serversData struct {
	Servers  []v1.Server
	Profiles []v1.Profile
	Form     launchForm
	Error    string
	CSRF     string
}

func (h *Handler) serversPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	h.renderServers(w, r, v, http.StatusOK, launchForm{Name: "notebook"}, "")
}

func (h *Handler) renderServers(w http.ResponseWriter, r *http.Request, v Viewer, status int, form launchForm, errMsg string) {
	ctx := r.Context()
	list, err := h.api.servers(ctx, r, v)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	profiles, err := h.api.profiles(ctx, r, v)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	if form.Profile == "" && len(profiles) > 0 {
		form.Profile = profiles[0].Name
	}
	form.Idem = rand.Text()
	slices.SortFunc(list, func(a, b v1.Server) int { return strings.Compare(a.Name, b.Name) })
	h.render(w, r, status, "servers", view{Title: "My servers", Nav: "servers", Viewer: &v,
		Data: serversData{Servers: list, Profiles: profiles, Form: form, Error: errMsg, CSRF: v.CSRF}})
}

func (h *Handler) launch(w http.ResponseWriter, r *http.Request, v Viewer) {
	form := launchForm{Name: strings.TrimSpace(r.PostForm.Get("name")), Profile: r.PostForm.Get("profile")}
	switch {
	case form.Name == "":
		h.renderServers(w, r, v, http.StatusBadRequest, form, "Give the server a name.")
		return
	case form.Profile == "":
		h.renderServers(w, r, v, http.StatusBadRequest, form, "Pick a profile.")
		return
	}
	_, err := h.api.create(r.Context(), r, v, form.Name, r.PostForm.Get("idem"), v1.CreateServerRequest{Profile: form.Profile})
	var ae *apiError
	switch {
	case errors.As(err, &ae) && ae.Status != http.StatusUnauthorized:
		h.renderServers(w, r, v, ae.Status, form, sentence(ae.Body.Message))
		return
	case err != nil:
		h.apiFailed(w, r, v, err)
		return
	}
	// A start from a notebook's page goes back there, which follows the
	// start and enters the notebook; only notebook paths are accepted.
	if next := r.PostForm.Get("next"); strings.HasPrefix(next, "/user/") && !strings.Contains(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/servers/"+url.PathEscape(form.Name), http.StatusSeeOther)
}

// ---- one server ----

// spawnSteps orders the states a start goes through, for the progress bar.
var spawnSteps = []v1.ServerState{v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning}

// stepOf returns the 1-based step of state in spawnSteps, or 0.
func stepOf(s v1.ServerState) int {
	return slices.Index(spawnSteps, s) + 1
}

type serverData struct {
	S      v1.Server
	Step   int // 1..len(spawnSteps), 0 when not starting or running
	Steps  int
	Live   bool // the state will change by itself: follow the events
	Events string
	API    string // the server's API path
	CSRF   string
	Chart  template.HTML // "" while there are no samples
	// UsageNote says why there is no chart.
	UsageNote string
	// IdleState and Countdown are the reclaimer's view of the server.
	IdleState, Countdown string
}

func (h *Handler) serverPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	s, err := h.api.server(r.Context(), r, v, name)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	d := serverData{S: s, Step: stepOf(s.State), Steps: len(spawnSteps), CSRF: v.CSRF,
		Events: serverPath(v.User, name) + "/events", API: serverPath(v.User, name)}
	switch s.State {
	case v1.StateRunning, v1.StateStopped, v1.StateFailed:
	default:
		d.Live = true
	}
	d.IdleState, d.Countdown = "Not checked: the server is not running.", "None."
	if s.State == v1.StateRunning {
		if st, err := h.api.idle(r.Context(), r, v, name); err != nil {
			h.deps.Log.WarnContext(r.Context(), "page: idle state", "err", err)
			d.IdleState, d.Countdown = "The idle state cannot be read right now.", "Unknown."
		} else {
			d.IdleState, d.Countdown = idleTexts(st, h.deps.Now())
		}
	}
	switch {
	case h.deps.Usage == nil:
		d.UsageNote = "No data yet: usage samples appear here once the node agent reports them for this slice."
	case s.GPU == nil:
		d.UsageNote = "No data yet: the server has no GPU slice at the moment."
	default:
		samples, err := h.deps.Usage.Samples(r.Context(), v.User, name, s.SpawnID)
		switch {
		case err != nil:
			h.deps.Log.WarnContext(r.Context(), "page: usage samples", "err", err)
			d.UsageNote = "Usage data cannot be read right now."
		case len(samples) == 0:
			d.UsageNote = "No data yet: no usage sample has been reported for this slice so far."
		default:
			d.Chart = Chart(samples, s.Slice.MemoryMiB)
		}
	}
	h.render(w, r, http.StatusOK, "server", view{Title: "Server " + s.Name, Nav: "servers", Viewer: &v, Data: d})
}

func (h *Handler) stop(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	if err := h.api.stop(r.Context(), r, v, name); err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
}

// ---- admin: fleet ----

type fleetGPU struct {
	v1.GPUStatus
	MemoryPercent int
	Servers       []v1.Server
	// Use is the measured use of the GPU's slices, in words: their summed
	// SM utilization and memory when every slice reported a fresh sample,
	// else why it is unknown.
	Use string
	// UseKnown is true when Use is a measurement.
	UseKnown bool
}

type fleetNode struct {
	Name string
	GPUs []fleetGPU
}

type fleetData struct {
	Nodes          []fleetNode
	GPUs           int
	MemoryMiB      int64
	AllocatedMiB   int64
	Servers        int
	UnplacedActive int
}

func (h *Handler) fleetPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	ctx := r.Context()
	gpus, err := h.api.gpus(ctx, r, v)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	all, err := h.api.allServers(ctx, r, v)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	byGPU := map[string][]v1.Server{}
	var d fleetData
	for _, s := range all {
		if s.GPU != nil && s.State != v1.StateStopped && s.State != v1.StateFailed {
			byGPU[s.GPU.UUID] = append(byGPU[s.GPU.UUID], s)
			d.Servers++
		}
	}
	slices.SortFunc(gpus, func(a, b v1.GPUStatus) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return strings.Compare(a.UUID, b.UUID)
	})
	for _, g := range gpus {
		if len(d.Nodes) == 0 || d.Nodes[len(d.Nodes)-1].Name != g.Node {
			d.Nodes = append(d.Nodes, fleetNode{Name: g.Node})
		}
		fg := fleetGPU{GPUStatus: g, Servers: byGPU[g.UUID]}
		fg.Use, fg.UseKnown = h.realUse(r, fg.Servers)
		if g.MemoryMiB > 0 {
			fg.MemoryPercent = int(g.AllocatedMemoryMiB * 100 / g.MemoryMiB)
		}
		n := &d.Nodes[len(d.Nodes)-1]
		n.GPUs = append(n.GPUs, fg)
		d.GPUs++
		d.MemoryMiB += g.MemoryMiB
		d.AllocatedMiB += g.AllocatedMemoryMiB
	}
	h.render(w, r, http.StatusOK, "fleet", view{Title: "Fleet", Nav: "fleet", Viewer: &v, Data: d})
}

// ---- admin: audit ----

type auditData struct {
	Filter url.Values
	Page   v1.AuditPage
	More   string // the next page's URL
	// Actions are the actions the log holds today, offered in the filter.
	Actions []string
}

// auditActions are the actions written to the audit log, for the action
// filter's suggestions.
var auditActions = []string{"reclaim-policy.update", "reclaim.warn", "reclaim.shrink", "reclaim.restore", "reclaim.stop",
	"reclaim.extend", "agent.report", "agent.kill", "agent.kill-failed"}

func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	in := r.URL.Query()
	q := url.Values{}
	for _, k := range []string{"source", "actor", "action", "target", "before"} {
		if s := strings.TrimSpace(in.Get(k)); s != "" {
			q.Set(k, s)
		}
	}
	q.Set("limit", "50")
	page, err := h.api.audit(r.Context(), r, v, q)
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusBadRequest {
		h.errorPage(w, r, &v, http.StatusBadRequest, sentence(ae.Body.Message))
		return
	}
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	d := auditData{Filter: q, Page: page, Actions: auditActions}
	if page.Next != "" {
		more := url.Values{}
		for _, k := range []string{"source", "actor", "action", "target"} {
			if s := q.Get(k); s != "" {
				more.Set(k, s)
			}
		}
		more.Set("before", page.Next)
		d.More = "/admin/audit?" + more.Encode()
	}
	h.render(w, r, http.StatusOK, "audit", view{Title: "Audit log", Nav: "audit", Viewer: &v, Data: d})
}

// realUse sums the fresh samples of servers' slices. Any slice without one
// makes the sum unknown: missing data never counts as idle.
func (h *Handler) realUse(r *http.Request, servers []v1.Server) (string, bool) {
	if h.deps.Usage == nil {
		return "No data yet", false
	}
	if len(servers) == 0 {
		return "No slices", false
	}
	var sm float64
	var mem int64
	reporting := 0
	for _, s := range servers {
		cur, ok, err := h.deps.Usage.Current(r.Context(), s.User, s.Name, s.SpawnID)
		if err != nil {
			h.deps.Log.WarnContext(r.Context(), "page: current usage", "err", err)
			continue
		}
		if ok {
			reporting++
			sm += cur.SMPercent
			mem += cur.MemoryMiB
		}
	}
	switch {
	case reporting == 0:
		return "No data yet", false
	case reporting < len(servers):
		return fmt.Sprintf("Unknown: %d of %d slices report no fresh sample", len(servers)-reporting, len(servers)), false
	}
	return fmt.Sprintf("SM %.0f %% · %s in use", sm, formatMiB(mem)), true
}
