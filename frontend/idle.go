package frontend

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func (c apiClient) idle(ctx context.Context, r *http.Request, v Viewer, name string) (v1.IdleState, error) {
	var out v1.IdleState
	return out, c.call(ctx, r, v, http.MethodGet, serverPath(v.User, name)+"/idle", nil, nil, &out)
}

func (c apiClient) extend(ctx context.Context, r *http.Request, v Viewer, name string, seconds int64) error {
	return c.call(ctx, r, v, http.MethodPost, serverPath(v.User, name)+"/extend", nil, v1.ExtendRequest{Seconds: seconds}, nil)
}

// idleTexts turns the reclaimer's view into the page's two lines: the idle
// state and the countdown.
func idleTexts(st v1.IdleState, now time.Time) (state, countdown string) {
	clock := func(t *time.Time) string { return t.UTC().Format("15:04 UTC") }
	switch st.Verdict {
	case v1.IdleActive:
		state = "Active: " + st.Reason + "."
	case v1.IdleIdle:
		state = "Idle"
		if st.Since != nil {
			state += " for " + strconv.FormatInt(int64(now.Sub(*st.Since)/time.Minute), 10) + " min (since " + clock(st.Since) + ")"
		}
		state += "."
	case v1.IdleUnknown:
		state = "Unknown: " + st.Reason + ". Unknown never counts as idle."
	default:
		state = "Not checked yet: the reclaimer looks at running servers every half minute or so."
	}
	switch {
	case st.Exempt:
		countdown = "None: this server is exempt from idle reclaim."
	case st.ExtendedUntil != nil:
		countdown = "Extended: no idle action before " + clock(st.ExtendedUntil) + "."
	case st.NextAt != nil && st.NextAction != "":
		verb := map[v1.ReclaimAction]string{v1.ReclaimWarn: "a warning", v1.ReclaimShrink: "its compute shrinks", v1.ReclaimStop: "it stops (your files are kept)"}[st.NextAction]
		countdown = "If it stays idle, " + verb + " at " + clock(st.NextAt) + " unless extended."
	default:
		countdown = "None: nothing is scheduled."
	}
	return state, countdown
}

// extendInput is the extend form's one field as rendered.
func extendInput(f form) numInput {
	return numInput{ID: "minutes", Name: "minutes", Label: "Extend by (minutes)", Value: f.value("minutes", "60"), Error: f.Errors["minutes"],
		Hint: "No warning, shrink or stop for idleness before then; the policy limits the total per start.", Mode: "numeric"}
}

// extend postpones idle actions on a server from the server page's form
// (whole minutes) and returns to the page. A problem (not a number, past
// the policy's limit, not running) shows the page again with the minutes
// as typed and the problem next to them.
func (h *Handler) extend(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	f := newForm()
	f.Sent = true
	f.Values["minutes"] = strings.TrimSpace(r.PostForm.Get("minutes"))
	m, ok := parseNumber(f.Values["minutes"], percent) // whole numbers
	var err error
	if f.Values["minutes"] == "" || !ok || m < 1 || m > 7*24*60 {
		f.Errors["minutes"] = "Enter a whole number of minutes from 1 to 10080 (7 days)."
	} else {
		err = h.api.extend(r.Context(), r, v, name, m*60)
		if err == nil {
			http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
			return
		}
		// The policy's limit is about the minutes; other refusals (not
		// running) are the form's problem.
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusBadRequest {
			ae.Body.Fields = append(ae.Body.Fields, v1.FieldProblem{Field: "seconds", Message: ae.Body.Message})
		}
		if !f.refusal(err, func(api string) string { return map[string]string{"seconds": "minutes"}[api] }) {
			h.apiFailed(w, r, v, err)
			return
		}
	}
	s, gerr := h.api.server(r.Context(), r, v, name)
	if gerr != nil {
		h.apiFailed(w, r, v, gerr)
		return
	}
	h.renderServer(w, r, v, s, serverForms{extend: f}, statusOf(err))
}
