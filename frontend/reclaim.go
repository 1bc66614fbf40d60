package frontend

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// The idle-reclaim settings page edits the whole policy (the form is in
// policyform.go). A save sends every field, so it never resets one the
// page does not show. All problems are shown at once, next to their
// fields, with the input kept: the form's own (not a number) and the API's
// validation of everything else. Preview shows what the reclaimer would do
// now under the form's policy, unsaved.

// fieldError is one problem (or, in a conflict notice, one typed value)
// with the label of its field.
type fieldError struct {
	ID, Label, Message string
}

// policyData is the settings page's data.
type policyData struct {
	Current  v1.ReclaimPolicy
	Form     policyForm
	Fields   map[string]numField
	Row      []overrideField
	Errors   map[string]string // form field id → message
	List     []fieldError      // the same, in form order, for the summary
	Problem  string            // a message that is not about one field
	Conflict string
	Unsaved  []fieldError // the admin's values that a conflict stopped (label, value)
	Saved    bool
	CSRF     string
	// Preview is what the reclaimer would do now under the form's policy
	// (nil: not asked).
	Preview *previewData
}

// previewData is the preview as the page shows it.
type previewData struct {
	At      string
	Enabled bool
	DryRun  bool
	Servers []previewRow
}

// previewRow is one running server of the preview.
type previewRow struct {
	Server, Profile  string
	State, Countdown string // idleTexts of the state after the cycle
	Actions          []v1.ReclaimPreviewAction
}

func previewOf(p v1.ReclaimPreview) *previewData {
	d := &previewData{At: p.At.UTC().Format("15:04:05 UTC"), Enabled: p.Policy.Enabled, DryRun: p.Policy.DryRun}
	for _, s := range p.Servers {
		state, countdown := idleTexts(s.Idle, p.At)
		d.Servers = append(d.Servers, previewRow{Server: s.User + "/" + s.Name, Profile: s.Profile,
			State: state, Countdown: countdown, Actions: s.Actions})
	}
	return d
}

func (h *Handler) policyPage(w http.ResponseWriter, r *http.Request, v Viewer) {
	p, err := h.api.policy(r.Context(), r, v)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	d := policyData{Current: p, Form: formOf(p), CSRF: v.CSRF, Saved: r.URL.Query().Get("saved") != ""}
	h.renderPolicy(w, r, v, http.StatusOK, d)
}

func (h *Handler) renderPolicy(w http.ResponseWriter, r *http.Request, v Viewer, status int, d policyData) {
	d.Fields, d.Row = policyFields, overrideFields
	if n := len(d.Form.Overrides); n == 0 || !d.Form.Overrides[n-1].empty() {
		d.Form.Overrides = append(d.Form.Overrides, blankOverride()) // room for one more
	}
	if d.Errors == nil {
		d.Errors = map[string]string{}
	}
	d.List = nil
	ids := slices.Clone(formOrder)
	for i := range d.Form.Overrides {
		p := "o" + strconv.Itoa(i) + "."
		ids = append(ids, p+"name", p+"exempt", p+"action")
		for _, ff := range overrideFields {
			ids = append(ids, p+ff.ID)
		}
	}
	for _, id := range ids {
		if m, ok := d.Errors[id]; ok {
			d.List = append(d.List, fieldError{ID: id, Label: label(id, d.Form), Message: m})
		}
	}
	h.render(w, r, status, "reclaim", view{Title: "Idle reclaim settings", Nav: "reclaim", Viewer: &v, Data: d})
}

// savePolicy handles the form's buttons: save (op=save, the default),
// preview (op=preview: what the reclaimer would do now under the form's
// policy; nothing is saved) and add an override row (op=add, nothing is
// sent).
func (h *Handler) savePolicy(w http.ResponseWriter, r *http.Request, v Viewer) {
	ctx := r.Context()
	f := readPolicyForm(r.PostForm)
	d := policyData{Form: f, CSRF: v.CSRF, Errors: map[string]string{}}
	if r.PostForm.Get("op") == "add" {
		cur, err := h.api.policy(ctx, r, v)
		if err != nil {
			h.apiFailed(w, r, v, err)
			return
		}
		d.Current = cur
		d.Form.Overrides = append(d.Form.Overrides, blankOverride())
		h.renderPolicy(w, r, v, http.StatusOK, d)
		return
	}
	pp := parsePolicyForm(f)
	d.Errors = pp.errs
	status := http.StatusBadRequest
	var err error
	switch {
	case len(pp.errs) > 0:
		// Validate the rest, so that every problem shows at once; the
		// fields already in error keep the form's own message.
		_, err = h.api.putPolicy(ctx, r, v, pp.policy, true)
	case r.PostForm.Get("op") == "preview":
		var pv v1.ReclaimPreview
		if pv, err = h.api.previewPolicy(ctx, r, v, pp.policy); err == nil {
			d.Preview, status = previewOf(pv), http.StatusOK
		}
	default:
		var saved v1.ReclaimPolicy
		if saved, err = h.api.putPolicy(ctx, r, v, pp.policy, false); err == nil {
			http.Redirect(w, r, "/admin/reclaim?saved="+strconv.FormatInt(saved.Version, 10), http.StatusSeeOther)
			return
		}
	}
	if !h.policyRefused(w, r, v, err, pp, &d) {
		return
	}
	if d.Conflict != "" {
		status = http.StatusConflict
	}
	cur, cerr := h.api.policy(ctx, r, v)
	if cerr != nil {
		h.apiFailed(w, r, v, cerr)
		return
	}
	d.Current = cur
	if d.Conflict != "" {
		d.Unsaved = unsaved(f, formOf(cur))
		d.Form = formOf(cur) // start again from what is saved now
	}
	h.renderPolicy(w, r, v, status, d)
}

// policyRefused folds the API's refusal err into d: field problems next to
// their fields (keeping the form's own), a conflict, or a problem that is
// about no field. It reports false when it rendered an error page itself.
func (h *Handler) policyRefused(w http.ResponseWriter, r *http.Request, v Viewer, err error, pp parsed, d *policyData) bool {
	var ae *apiError
	switch {
	case err == nil:
	case errors.As(err, &ae) && ae.Status == http.StatusBadRequest:
		var other []string
		for _, fp := range ae.Body.Fields {
			id := pp.formID(fp.Field)
			switch {
			case id == "":
				other = append(other, fp.Field+": "+fp.Message)
			case d.Errors[id] == "":
				d.Errors[id] = fp.Message
			}
		}
		switch {
		case len(ae.Body.Fields) == 0:
			d.Problem = sentence(ae.Body.Message)
		case len(other) > 0:
			d.Problem = sentence(strings.Join(other, "; "))
		}
	case errors.As(err, &ae) && ae.Status == http.StatusConflict:
		d.Conflict = sentence(ae.Body.Message)
	default:
		h.apiFailed(w, r, v, err)
		return false
	}
	return true
}

// unsaved lists the typed values of f that differ from what is saved now
// (cur), as label and value, for the conflict notice.
func unsaved(f, cur policyForm) []fieldError {
	var out []fieldError
	add := func(id, typed, now string) {
		if strings.TrimSpace(typed) != strings.TrimSpace(now) {
			out = append(out, fieldError{ID: id, Label: label(id, f), Message: typed})
		}
	}
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	add("enabled", onOff(f.Enabled), onOff(cur.Enabled))
	add("dryRun", onOff(f.DryRun), onOff(cur.DryRun))
	add("action", f.Action, cur.Action)
	for _, id := range formOrder {
		if _, ok := policyFields[id]; ok {
			add(id, f.Nums[id], cur.Nums[id])
		}
	}
	add("exemptUsers", f.ExemptUsers, cur.ExemptUsers)
	add("exemptGroups", f.ExemptGroups, cur.ExemptGroups)
	var typed, now []string
	for _, o := range f.Overrides {
		if !o.empty() {
			typed = append(typed, o.summary())
		}
	}
	for _, o := range cur.Overrides {
		if !o.empty() {
			now = append(now, o.summary())
		}
	}
	add("overrides", strings.Join(typed, "; "), strings.Join(now, "; "))
	return out
}

// numInput is one number field as the template renders it.
type numInput struct {
	ID, Name, Label, Hint, Value, Error string
	Mode                                string // inputmode: numeric for whole numbers
}

func inputMode(u unit) string {
	if u.whole {
		return "numeric"
	}
	return "decimal"
}

// Num is policy field id as rendered.
func (d policyData) Num(id string) numInput {
	nf := policyFields[id]
	return numInput{ID: id, Name: id, Label: nf.Label, Hint: nf.Hint, Value: d.Form.Nums[id], Error: d.Errors[id], Mode: inputMode(nf.unit)}
}

// overrideRow is one override row as the template renders it.
type overrideRow struct {
	N           int    // 1-based, for people
	P           string // the fields' name prefix, "o<i>."
	Form        overrideForm
	Fields      []numInput
	NameError   string
	ActionError string
	ExemptError string
}

// Rows are the override rows as rendered.
func (d policyData) Rows() []overrideRow {
	out := make([]overrideRow, len(d.Form.Overrides))
	for i, o := range d.Form.Overrides {
		p := "o" + strconv.Itoa(i) + "."
		row := overrideRow{N: i + 1, P: p, Form: o, NameError: d.Errors[p+"name"], ActionError: d.Errors[p+"action"], ExemptError: d.Errors[p+"exempt"]}
		for _, ff := range overrideFields {
			row.Fields = append(row.Fields, numInput{ID: p + ff.ID, Name: p + ff.ID, Label: ff.Label, Value: o.Nums[ff.ID],
				Error: d.Errors[p+ff.ID], Mode: inputMode(ff.unit)})
		}
		out[i] = row
	}
	return out
}
