package frontend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// The server page's forms (resize, extend) and the launch form keep the
// user where they were: a refusal renders the same page again with every
// problem next to its field, the input as typed, and the API's words
// turned into the form's units (GiB, percent, minutes), never MiB or
// seconds the user did not type.

func (c apiClient) resize(ctx context.Context, r *http.Request, v Viewer, name string, req v1.ResizeRequest) (v1.ResizeResult, error) {
	var out v1.ResizeResult
	return out, c.call(ctx, r, v, http.MethodPatch, serverPath(v.User, name)+"/slice", nil, req, &out)
}

// gib is the resize form's memory unit: MiB per GiB, any fraction.
var gib = unit{scale: 1024, what: "a number of GiB"}

// form is a form as typed and what is wrong with it: Values and Errors by
// field name, and Problem, a refusal that is no one field's.
type form struct {
	Values  map[string]string
	Errors  map[string]string
	Problem string
	// Sent is true once the form was posted (a refused form is shown as
	// typed; an unsent one shows the server's values).
	Sent bool
}

func newForm() form { return form{Values: map[string]string{}, Errors: map[string]string{}} }

// value is the field's value as typed, or def when the form was not sent.
func (f form) value(name, def string) string {
	if f.Sent {
		return f.Values[name]
	}
	return def
}

// The resize form's fields.
var resizeFields = []struct {
	name, label, hint string
	u                 unit
}{
	{"memoryGiB", "GPU memory (GiB)", "The notebook keeps running. Memory cannot shrink below what it uses now.", gib},
	{"computePercent", "Guaranteed compute (%)", "1 to 100 % of the GPU's SMs.", percent},
	{"computeLimitPercent", "Compute limit (%)", "The burst ceiling: from the guaranteed compute up to 100 %.", percent},
}

// resizeInputs are the resize form's fields as rendered for s.
func resizeInputs(f form, s v1.Server) []numInput {
	cur := map[string]string{
		"memoryGiB":           gibNumber(s.Slice.MemoryMiB),
		"computePercent":      strconv.Itoa(s.Slice.ComputePercent),
		"computeLimitPercent": strconv.Itoa(s.Slice.ComputeLimitPercent),
	}
	out := make([]numInput, len(resizeFields))
	for i, rf := range resizeFields {
		out[i] = numInput{ID: rf.name, Name: rf.name, Label: rf.label, Hint: rf.hint, Value: f.value(rf.name, cur[rf.name]),
			Error: f.Errors[rf.name], Mode: inputMode(rf.u)}
	}
	return out
}

// readResize reads the resize form against the server's current slice:
// every problem at once, in GiB and percent, one per field; the request
// carries only the fields that change.
func readResize(pf url.Values, cur v1.Slice) (form, v1.ResizeRequest) {
	f := newForm()
	f.Sent = true
	for _, rf := range resizeFields {
		f.Values[rf.name] = strings.TrimSpace(pf.Get(rf.name))
	}
	var req v1.ResizeRequest
	mem, ok := parseNumber(f.Values["memoryGiB"], gib)
	switch {
	case f.Values["memoryGiB"] == "":
		f.Errors["memoryGiB"] = "Enter the GPU memory in GiB, for example 8 or 1.5."
	case !ok || mem < 1 || mem > 1<<30:
		f.Errors["memoryGiB"] = "Enter the GPU memory as a number of GiB above 0, for example 8 or 1.5."
	case mem != cur.MemoryMiB:
		req.MemoryMiB = &mem
	}
	pct := func(name string) (int, bool) {
		n, ok := parseNumber(f.Values[name], percent)
		if f.Values[name] == "" || !ok || n < 1 || n > 100 {
			f.Errors[name] = "Enter a whole percent from 1 to 100."
			return 0, false
		}
		return int(n), true
	}
	cp, okCP := pct("computePercent")
	cl, okCL := pct("computeLimitPercent")
	if okCP && okCL && cl < cp {
		f.Errors["computeLimitPercent"] = fmt.Sprintf("The limit must be at least the guaranteed compute (%d %%).", cp)
	}
	if okCP && cp != cur.ComputePercent {
		req.ComputePercent = &cp
	}
	if okCL && cl != cur.ComputeLimitPercent {
		req.ComputeLimitPercent = &cl
	}
	if len(f.Errors) == 0 && req.MemoryMiB == nil && req.ComputePercent == nil && req.ComputeLimitPercent == nil {
		f.Problem = "Nothing to change: the slice already has these values."
	}
	return f, req
}

// apiFieldToForm names the resize form's field of an API field.
var apiFieldToForm = map[string]string{"memoryMiB": "memoryGiB", "computePercent": "computePercent", "computeLimitPercent": "computeLimitPercent"}

// refusal puts an API refusal into f in the form's units: a field problem
// or a limit next to its field (memory in GiB), anything else as the
// form's problem in the API's words. It returns false when err is no
// refusal (the page then fails as a whole).
func (f *form) refusal(err error, field func(api string) string) bool {
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status == http.StatusUnauthorized || ae.Status >= 500 && ae.Status != http.StatusServiceUnavailable {
		return false
	}
	placed := false
	for _, p := range ae.Body.Fields {
		if name := field(p.Field); name != "" {
			f.Errors[name] = sentence(fieldText(p))
			placed = true
		}
	}
	if l := ae.Body.Limit; l != nil {
		if name := field(l.Resource); name != "" {
			f.Errors[name] = limitText(*l)
		} else {
			f.Problem = limitText(*l)
		}
		return true
	}
	if !placed {
		f.Problem = sentence(ae.Body.Message)
	}
	return true
}

// fieldText is an API field problem in the form's units: memory problems
// are told without the API's MiB.
func fieldText(p v1.FieldProblem) string {
	if p.Field == "memoryMiB" {
		return "The GPU memory must be more than 0 GiB"
	}
	return strings.TrimSuffix(p.Message, ".")
}

// gibText writes MiB as GiB for a sentence: "16 GiB", "1.5 GiB".
func gibText(mib int64) string { return gibNumber(mib) + " GiB" }

// limitText says in the pages' units what limit a refusal hit.
func limitText(l v1.Limit) string {
	amount := func(n int64) string {
		switch l.Resource {
		case "memoryMiB":
			return gibText(n) + " of GPU memory"
		case "computePercent":
			return strconv.FormatInt(n, 10) + " % compute"
		}
		if n == 1 {
			return "1 server"
		}
		return strconv.FormatInt(n, 10) + " servers"
	}
	switch l.Kind {
	case v1.LimitQuota:
		whose := "Your quota"
		if l.Scope == "group" {
			whose = "The quota of your group " + l.Name
		}
		switch l.Resource {
		case "servers":
			return fmt.Sprintf("%s allows %s at once, and %d are in use. Stop one to start another.", whose, amount(l.Limit), l.Used)
		case "memoryMiB":
			return fmt.Sprintf("%s allows %s; %s are in use, and this needs %s more.", whose, amount(l.Limit), gibText(l.Used), gibText(l.Want))
		}
		return fmt.Sprintf("%s allows %s; %d %% are in use, and this needs %d %% more.", whose, amount(l.Limit), l.Used, l.Want)
	case v1.LimitGPU:
		if l.Scope == v1.LimitScopeServer {
			return fmt.Sprintf("The GPU this server is on (node %s) has room for at most %s for it; this asks %s.", l.Name, amount(l.Limit), amount(l.Want))
		}
		return fmt.Sprintf("No GPU has room for %s: the most any has free is %s (node %s).", amount(l.Want), amount(l.Limit), l.Name)
	case v1.LimitInUse:
		return fmt.Sprintf("The notebook uses %s now; memory cannot shrink below that.", amount(l.Limit))
	}
	return "A limit was reached."
}

// resize changes a running server's slice from the server page's form.
// Done, it returns to the page, whose message then says what happened
// ("resized to …"); refused (by the form or the API), it shows the page
// again with the form as typed and every problem next to its field.
func (h *Handler) resize(w http.ResponseWriter, r *http.Request, v Viewer) {
	name := r.PathValue("name")
	s, err := h.api.server(r.Context(), r, v, name)
	if err != nil {
		h.apiFailed(w, r, v, err)
		return
	}
	f, req := readResize(r.PostForm, s.Slice)
	if len(f.Errors) == 0 && f.Problem == "" {
		_, err = h.api.resize(r.Context(), r, v, name, req)
		if err == nil {
			http.Redirect(w, r, "/servers/"+url.PathEscape(name), http.StatusSeeOther)
			return
		}
		if !f.refusal(err, func(api string) string { return apiFieldToForm[api] }) {
			h.apiFailed(w, r, v, err)
			return
		}
	}
	h.renderServer(w, r, v, s, serverForms{resize: f}, statusOf(err))
}

// statusOf is the page's status after a refusal: the API's, or 400 for
// the form's own problems.
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return http.StatusBadRequest
}

// gibNumber is mib in GiB as a plain number for a form field, with up to
// three decimals and no trailing zeros (10240 → "10", 1536 → "1.5").
func gibNumber(mib int64) string {
	return strconv.FormatFloat(math.Round(float64(mib)/1024*1000)/1000, 'f', -1, 64)
}
