package frontend

import (
	"crypto/rand"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
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
	// NameError and ProfileError are problems of those fields; Problem a
	// refusal that is neither's (a quota, no room), in the page's units.
	NameError, ProfileError, Problem string
	// Confirm, when set, asks whether to start an existing stopped server
	// with another profile than its last one: that profile's name.
	Confirm string
}

// quotaLine is one cap of the viewer and its use, in words.
type quotaLine struct {
	Whose string // "Your quota", "Group ml"
	Use   string // "2 of 2 servers, 32 of 96 GiB, 35 of 100 % compute"
	Full  bool   // a dimension is at its cap
}

type serversData struct {
	Servers  []v1.Server
	Profiles []v1.Profile
	Form     launchForm
	Quota    []quotaLine
	CSRF     string
}

func (h *Handler) serversPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	h.renderServers(w, r, v, http.StatusOK, launchForm{Name: "notebook"})
}

func (h *Handler) renderServers(w http.ResponseWriter, r *http.Request, v Viewer, status int, form launchForm) {
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
	var lines []quotaLine
	if q, err := h.api.quota(ctx, r, v); err != nil {
		h.deps.Log.WarnContext(ctx, "page: quota", "err", err)
		lines = []quotaLine{{Whose: "Your quota", Use: "cannot be read right now"}}
	} else {
		lines = quotaLines(q)
	}
	if form.Profile == "" && len(profiles) > 0 {
		form.Profile = profiles[0].Name
	}
	form.Idem = rand.Text()
	slices.SortFunc(list, func(a, b v1.Server) int { return strings.Compare(a.Name, b.Name) })
	h.render(w, r, status, "servers", view{Title: "My servers", Nav: "servers", Viewer: &v,
		Data: serversData{Servers: list, Profiles: profiles, Form: form, Quota: lines, CSRF: v.CSRF}})
}

// quotaLines says each cap and its use: "2 of 2 servers, 32 of 96 GiB,
// 35 of 100 % compute"; a dimension without a cap reads "2 servers (no
// limit)".
func quotaLines(q v1.Quota) []quotaLine {
	out := make([]quotaLine, 0, len(q.Quotas))
	for _, u := range q.Quotas {
		l := quotaLine{Whose: "Your quota"}
		if u.Scope == "group" {
			l.Whose = "Group " + u.Name + " (shared by its members)"
		}
		part := func(used, limit int64, num func(int64) string, unit string) string {
			if limit == 0 {
				return num(used) + unit + " (no limit)"
			}
			if used >= limit {
				l.Full = true
			}
			return num(used) + " of " + num(limit) + unit
		}
		itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
		l.Use = part(int64(u.Used.Servers), int64(u.Limit.Servers), itoa, " servers") + ", " +
			part(u.Used.MemoryMiB, u.Limit.MemoryMiB, gibNumber, " GiB") + ", " +
			part(int64(u.Used.ComputePercent), int64(u.Limit.ComputePercent), itoa, " % compute")
		out = append(out, l)
	}
	return out
}

// launch starts a server from the launch form (or a server page's "Start
// again"). A name that is running or starting shows that server; a
// stopped one with another profile asks first. A refusal shows the form
// again as typed, with the problem next to its field (or, from a server
// page, that page with the problem).
func (h *Handler) launch(w http.ResponseWriter, r *http.Request, v Viewer) {
	pf := r.PostForm
	form := launchForm{Name: strings.TrimSpace(pf.Get("name")), Profile: pf.Get("profile")}
	fromServer := pf.Get("origin") == "server"
	if form.Name == "" {
		form.NameError = "Give the server a name."
	}
	if form.Profile == "" {
		form.ProfileError = "Pick a profile."
	}
	if form.NameError != "" || form.ProfileError != "" {
		h.renderServers(w, r, v, http.StatusBadRequest, form)
		return
	}
	cur, err := h.api.server(r.Context(), r, v, form.Name)
	var ae *apiError
	switch {
	case err == nil && !terminal(cur.State):
		h.afterLaunch(w, r, form.Name)
		return
	case err == nil && cur.Profile != form.Profile && pf.Get("confirm") != form.Profile:
		form.Confirm = form.Profile
		h.renderServers(w, r, v, http.StatusOK, form)
		return
	case err != nil && !(errors.As(err, &ae) && ae.Status == http.StatusNotFound):
		h.apiFailed(w, r, v, err)
		return
	}
	_, err = h.api.create(r.Context(), r, v, form.Name, pf.Get("idem"), v1.CreateServerRequest{Profile: form.Profile})
	if err == nil {
		h.afterLaunch(w, r, form.Name)
		return
	}
	f := newForm()
	if !f.refusal(err, func(api string) string { return map[string]string{"profile": "profile"}[api] }) {
		h.apiFailed(w, r, v, err)
		return
	}
	if fromServer && cur.Name != "" {
		f.Problem = strings.TrimSpace("Not started again. " + f.Problem + " " + f.Errors["profile"])
		h.renderServer(w, r, v, cur, serverForms{launch: f}, statusOf(err))
		return
	}
	form.Problem, form.ProfileError = f.Problem, f.Errors["profile"]
	h.renderServers(w, r, v, statusOf(err), form)
}

// afterLaunch sends the browser on after a start, or a start of a server
// that is already live: back to the notebook's page when the start came
// from there (it follows the start and enters the notebook; only notebook
// paths are accepted), else to the server's page.
func (h *Handler) afterLaunch(w http.ResponseWriter, r *http.Request, name string) {
	if next := r.PostForm.Get("next"); strings.HasPrefix(next, "/user/") && !strings.Contains(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
}

// terminal reports whether a server's state ends its start: stopped or failed.
func terminal(s v1.ServerState) bool { return s == v1.StateStopped || s == v1.StateFailed }

// ---- one server ----

// spawnSteps orders the states a start goes through before it runs, for
// the progress bar; a running server has none.
var spawnSteps = []v1.ServerState{v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting}

// stepOf returns the 1-based step of state in spawnSteps, or 0.
func stepOf(s v1.ServerState) int {
	return slices.Index(spawnSteps, s) + 1
}

// serverForms are the server page's forms after a post; zero: fresh.
type serverForms struct {
	resize, extend, launch form
}

type serverData struct {
	S    v1.Server
	Step int // 1..Steps while starting, else 0
	// Steps is the number of steps before running.
	Steps int
	// Live: the state will change by itself (anything but stopped or
	// failed): the page follows the events and renders itself again.
	Live bool
	// Page is the page's own path, which the script fetches again.
	Page string
	// UpdatedMS is the record's last change (Unix ms): the stream's events
	// up to it are already on the page.
	UpdatedMS int64
	Events    string
	API       string // the server's API path
	CSRF      string
	Chart     template.HTML // "" while there are no samples
	// UsageNote says why there is no chart.
	UsageNote string
	// IdleState and Countdown are the reclaimer's view of the server.
	IdleState, Countdown string
	// Resize and Extend are the running server's forms; Problem their
	// problems that no field owns.
	Resize        []numInput
	ResizeProblem string
	Extend        numInput
	ExtendProblem string
	// AgainIdem is the "Start again" form's idempotency key: one per
	// spawn, so a double click starts once; AgainProblem its refusal.
	AgainIdem, AgainProblem string
}

func (h *Handler) serverPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	s, err := h.api.server(r.Context(), r, v, r.PathValue("name"))
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	h.renderServer(w, r, v, s, serverForms{}, http.StatusOK)
}

// renderServer renders server s's page with its forms as given, with
// status. GET and the failed posts render it alike, so the page after a
// refusal is the page itself.
func (h *Handler) renderServer(w http.ResponseWriter, r *http.Request, v Viewer, s v1.Server, forms serverForms, status int) {
	name := s.Name
	page := "/servers/" + url.PathEscape(name)
	d := serverData{S: s, Step: stepOf(s.State), Steps: len(spawnSteps), CSRF: v.CSRF, Live: !terminal(s.State), Page: page,
		UpdatedMS: s.UpdatedAt.UnixMilli(),
		Events:    serverPath(v.User, name) + "/events", API: serverPath(v.User, name),
		Resize: resizeInputs(forms.resize, s), ResizeProblem: forms.resize.Problem,
		Extend: extendInput(forms.extend), ExtendProblem: forms.extend.Problem,
		AgainIdem: "again-" + s.SpawnID, AgainProblem: forms.launch.Problem}
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
		d.UsageNote = "No data yet: the server holds no GPU slice at the moment."
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
	h.render(w, r, status, "server", view{Title: "Server " + s.Name, Nav: "servers", Viewer: &v, Data: d})
}

func (h *Handler) stop(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	if err := h.api.stop(r.Context(), r, v, name); err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
}

// remove removes a stopped or failed server and returns to the list.
func (h *Handler) remove(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	if err := h.api.remove(r.Context(), r, v, name); err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	http.Redirect(w, r, "/servers", http.StatusSeeOther)
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
var auditActions = []string{"server.create", "server.stop", "server.remove", "server.resize", "reclaim-policy.update", "reclaim.warn", "reclaim.shrink", "reclaim.restore", "reclaim.stop",
	"reclaim.extend", "agent.report", "agent.kill", "agent.kill-failed"}

func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	in := r.URL.Query()
	q := url.Values{}
	for _, k := range []string{"source", "user", "server", "actor", "action", "target", "before"} {
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
		for _, k := range []string{"source", "user", "server", "actor", "action", "target"} {
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
