package frontend

import (
	"context"
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

// extend postpones idle actions on a server from the server page's form
// (minutes) and returns to the page; the API's refusal (past the policy's
// limit, not running) is shown in its own words.
func (h *Handler) extend(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	m, err := strconv.ParseInt(strings.TrimSpace(r.PostForm.Get("minutes")), 10, 64)
	if err != nil || m < 1 || m > 7*24*60 {
		h.errorPage(w, r, &v, http.StatusBadRequest, "Enter how many minutes to extend by (1 to 10080).")
		return
	}
	if err := h.api.extend(r.Context(), r, v, name, m*60); err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
}
