package frontend

import (
	"context"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func (c apiClient) resize(ctx context.Context, r *http.Request, v Viewer, name string, req v1.ResizeRequest) (v1.ResizeResult, error) {
	var out v1.ResizeResult
	return out, c.call(ctx, r, v, http.MethodPatch, serverPath(v.User, name)+"/slice", nil, req, &out)
}

// resizeRequest reads the server page's resize form: memoryGiB (GiB, may
// be fractional; sent as whole MiB), computePercent and computeLimitPercent
// (whole percents). An empty field keeps the current value. It returns a
// sentence for a person when a field is not a number.
func resizeRequest(form url.Values) (v1.ResizeRequest, string) {
	var req v1.ResizeRequest
	if s := strings.TrimSpace(form.Get("memoryGiB")); s != "" {
		gib, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(gib) || gib <= 0 || gib > 1<<20 {
			return req, "GPU memory must be a positive number of GiB."
		}
		mib := int64(math.Round(gib * 1024))
		req.MemoryMiB = &mib
	}
	for _, f := range []struct {
		field, label string
		dst          **int
	}{{"computePercent", "Guaranteed compute", &req.ComputePercent}, {"computeLimitPercent", "Compute limit", &req.ComputeLimitPercent}} {
		s := strings.TrimSpace(form.Get(f.field))
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return req, f.label + " must be a whole percent."
		}
		*f.dst = &n
	}
	if req.MemoryMiB == nil && req.ComputePercent == nil && req.ComputeLimitPercent == nil {
		return req, "Enter a new GPU memory or compute share."
	}
	return req, ""
}

// resize changes a running server's slice from the server page's form and
// returns to the page, whose message then says what happened ("resized to
// …"). A refusal (no room, quota, memory in use) is shown with the API's
// own words.
func (h *Handler) resize(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	req, problem := resizeRequest(r.PostForm)
	if problem != "" {
		h.errorPage(w, r, &v, http.StatusBadRequest, problem)
		return
	}
	if _, err := h.api.resize(r.Context(), r, v, name, req); err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
}

// gibNumber is mib in GiB as a plain number for a form field, with up to
// three decimals and no trailing zeros (10240 → "10", 1536 → "1.5").
func gibNumber(mib int64) string {
	return strconv.FormatFloat(math.Round(float64(mib)/1024*1000)/1000, 'f', -1, 64)
}
