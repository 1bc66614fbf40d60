package frontend

import (
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// The reclaim settings form and the policy document (v1.ReclaimPolicy):
// every field of the document has a form field (the policy's and each
// override's), in the form's units (percent, minutes, hours; the API's are
// seconds), and formOf and parsePolicyForm are the one converter between
// the two. TestPolicyFormCarriesEveryField checks by reflection that an
// unchanged form sends back every field.

// unit is a form field's unit: how many of the API's units one form unit
// is, and how a wrong entry is told.
type unit struct {
	scale float64 // API units per form unit
	whole bool    // only whole numbers
	what  string  // "a number of minutes"
}

var (
	percent = unit{scale: 1, whole: true, what: "a whole number of percent"}
	minutes = unit{scale: 60, what: "a number of minutes"}
	hours   = unit{scale: 3600, what: "a number of hours"}
)

// numField is one number field of the policy form.
type numField struct {
	ID    string // the form field's name and the element's id
	API   string // the API's JSON field
	Label string
	Hint  string
	unit  unit
	// Blank: 0 is shown as an empty field (it means none, the default or
	// inherit); else as "0".
	blank bool
	get   func(*v1.ReclaimPolicy) int64
	set   func(*v1.ReclaimPolicy, int64)
}

// policyFields are the policy's number fields by form id.
var policyFields = map[string]numField{
	"idleComputePercent": {ID: "idleComputePercent", API: "idleComputePercent", Label: "Idle below (% SM utilization)",
		Hint: "0 to 100. A server using at most this share of its GPU's SMs counts as idle.", unit: percent,
		get: func(p *v1.ReclaimPolicy) int64 { return int64(p.IdleComputePercent) },
		set: func(p *v1.ReclaimPolicy, n int64) { p.IdleComputePercent = clampInt(n) }},
	"idleAfterMinutes": {ID: "idleAfterMinutes", API: "idleAfterSeconds", Label: "Idle for (minutes)",
		Hint: "1 minute to 7 days (10080 minutes).", unit: minutes,
		get: func(p *v1.ReclaimPolicy) int64 { return p.IdleAfterSeconds },
		set: func(p *v1.ReclaimPolicy, n int64) { p.IdleAfterSeconds = n }},
	"warnMinutes": {ID: "warnMinutes", API: "warnSeconds", Label: "Warning before shrink or stop (minutes)",
		Hint: "0 to 24 hours, and shorter than the idle time.", unit: minutes,
		get: func(p *v1.ReclaimPolicy) int64 { return p.WarnSeconds },
		set: func(p *v1.ReclaimPolicy, n int64) { p.WarnSeconds = n }},
	"shrinkComputePercent": {ID: "shrinkComputePercent", API: "shrinkComputePercent", Label: "Shrink to (% compute guaranteed)",
		Hint: `Only for "shrink": 1 to 100.`, unit: percent, blank: true,
		get: func(p *v1.ReclaimPolicy) int64 { return int64(p.ShrinkComputePercent) },
		set: func(p *v1.ReclaimPolicy, n int64) { p.ShrinkComputePercent = clampInt(n) }},
	"stopAfterMinutes": {ID: "stopAfterMinutes", API: "stopAfterSeconds", Label: "Then stop after (minutes idle)",
		Hint: `Only for "shrink": also stop the server once it has been idle this long; longer than the idle time plus the warning, at most 7 days. Empty: never.`,
		unit: minutes, blank: true,
		get: func(p *v1.ReclaimPolicy) int64 { return p.StopAfterSeconds },
		set: func(p *v1.ReclaimPolicy, n int64) { p.StopAfterSeconds = n }},
	"minRunningMinutes": {ID: "minRunningMinutes", API: "minRunningSeconds", Label: "Minimum running time (minutes)",
		Hint: "A server running for less than this never counts as idle. Empty: none; at most 7 days.", unit: minutes, blank: true,
		get: func(p *v1.ReclaimPolicy) int64 { return p.MinRunningSeconds },
		set: func(p *v1.ReclaimPolicy, n int64) { p.MinRunningSeconds = n }},
	"maxAgeHours": {ID: "maxAgeHours", API: "maxAgeSeconds", Label: "Maximum running time (hours)",
		Hint: "A server running longer than this is stopped, busy or not, after the warning. Empty: no limit; else 1 hour to 90 days (2160 hours).",
		unit: hours, blank: true,
		get: func(p *v1.ReclaimPolicy) int64 { return p.MaxAgeSeconds },
		set: func(p *v1.ReclaimPolicy, n int64) { p.MaxAgeSeconds = n }},
	"maxExtendMinutes": {ID: "maxExtendMinutes", API: "maxExtendSeconds", Label: "Extension limit per start (minutes)",
		Hint: "How long a user may postpone idle actions on one start of a server, in total. Empty: 240 minutes (4 hours); at most 7 days.",
		unit: minutes, blank: true,
		get: func(p *v1.ReclaimPolicy) int64 { return p.MaxExtendSeconds },
		set: func(p *v1.ReclaimPolicy, n int64) { p.MaxExtendSeconds = n }},
}

// overrideField is one number field of an override row; 0 (empty) inherits.
type overrideField struct {
	ID    string // the field's name within the row: o<i>.<ID>
	API   string
	Label string
	unit  unit
	get   func(*v1.ReclaimOverride) int64
	set   func(*v1.ReclaimOverride, int64)
}

// overrideFields are an override row's number fields, in form order.
var overrideFields = []overrideField{
	{ID: "idleAfterMinutes", API: "idleAfterSeconds", Label: "Idle for (minutes)", unit: minutes,
		get: func(o *v1.ReclaimOverride) int64 { return o.IdleAfterSeconds },
		set: func(o *v1.ReclaimOverride, n int64) { o.IdleAfterSeconds = n }},
	{ID: "warnMinutes", API: "warnSeconds", Label: "Warning (minutes)", unit: minutes,
		get: func(o *v1.ReclaimOverride) int64 { return o.WarnSeconds },
		set: func(o *v1.ReclaimOverride, n int64) { o.WarnSeconds = n }},
	{ID: "shrinkComputePercent", API: "shrinkComputePercent", Label: "Shrink to (%)", unit: percent,
		get: func(o *v1.ReclaimOverride) int64 { return int64(o.ShrinkComputePercent) },
		set: func(o *v1.ReclaimOverride, n int64) { o.ShrinkComputePercent = clampInt(n) }},
	{ID: "stopAfterMinutes", API: "stopAfterSeconds", Label: "Then stop after (minutes)", unit: minutes,
		get: func(o *v1.ReclaimOverride) int64 { return o.StopAfterSeconds },
		set: func(o *v1.ReclaimOverride, n int64) { o.StopAfterSeconds = n }},
	{ID: "minRunningMinutes", API: "minRunningSeconds", Label: "Minimum running time (minutes)", unit: minutes,
		get: func(o *v1.ReclaimOverride) int64 { return o.MinRunningSeconds },
		set: func(o *v1.ReclaimOverride, n int64) { o.MinRunningSeconds = n }},
	{ID: "maxAgeHours", API: "maxAgeSeconds", Label: "Maximum running time (hours)", unit: hours,
		get: func(o *v1.ReclaimOverride) int64 { return o.MaxAgeSeconds },
		set: func(o *v1.ReclaimOverride, n int64) { o.MaxAgeSeconds = n }},
}

// fieldLabels names the form's other fields, for the error summary.
var fieldLabels = map[string]string{
	"enabled": "Reclaiming", "dryRun": "Dry run", "action": "Then", "exemptUsers": "Exempt users",
	"exemptGroups": "Exempt groups", "overrides": "Overrides", "reason": "Reason",
}

// formOrder is the order of the form's top fields, for the error summary;
// override rows follow in their order.
var formOrder = []string{"enabled", "dryRun", "idleComputePercent", "idleAfterMinutes", "action", "shrinkComputePercent",
	"stopAfterMinutes", "warnMinutes", "minRunningMinutes", "maxAgeHours", "maxExtendMinutes", "exemptUsers", "exemptGroups",
	"overrides", "reason"}

func clampInt(n int64) int { return int(max(min(n, math.MaxInt32), math.MinInt32)) }

// policyForm is the policy form as typed (strings, so that a wrong entry
// is shown back as it was typed).
type policyForm struct {
	Version      int64
	Enabled      bool
	DryRun       bool
	Action       string
	Nums         map[string]string // numField.ID → text
	ExemptUsers  string
	ExemptGroups string
	Overrides    []overrideForm
	Reason       string
}

// overrideForm is one override row as typed.
type overrideForm struct {
	Kind   string // "profile" or "group"
	Name   string
	Exempt bool
	Action string            // "" inherits
	Nums   map[string]string // overrideField.ID → text
}

// empty reports whether the row holds nothing: it is left out of the policy.
func (o overrideForm) empty() bool {
	if strings.TrimSpace(o.Name) != "" || o.Exempt || o.Action != "" {
		return false
	}
	for _, v := range o.Nums {
		if strings.TrimSpace(v) != "" {
			return false
		}
	}
	return true
}

// number writes n API units in unit u; "" for 0 when blank.
func number(n int64, u unit, blank bool) string {
	if n == 0 && blank {
		return ""
	}
	if int64(u.scale) != 0 && n%int64(u.scale) == 0 {
		return strconv.FormatInt(n/int64(u.scale), 10)
	}
	return strconv.FormatFloat(float64(n)/u.scale, 'f', -1, 64)
}

// formOf is the form showing p, with one empty override row to add one.
func formOf(p v1.ReclaimPolicy) policyForm {
	f := policyForm{Version: p.Version, Enabled: p.Enabled, DryRun: p.DryRun, Action: string(p.Action), Nums: map[string]string{},
		ExemptUsers: strings.Join(p.ExemptUsers, ", "), ExemptGroups: strings.Join(p.ExemptGroups, ", "), Reason: p.Reason}
	for id, nf := range policyFields {
		f.Nums[id] = number(nf.get(&p), nf.unit, nf.blank)
	}
	for _, o := range p.Overrides {
		of := overrideForm{Kind: "profile", Name: o.Profile, Exempt: o.Exempt, Action: string(o.Action), Nums: map[string]string{}}
		if o.Group != "" {
			of.Kind, of.Name = "group", o.Group
		}
		for _, ff := range overrideFields {
			of.Nums[ff.ID] = number(ff.get(&o), ff.unit, true)
		}
		f.Overrides = append(f.Overrides, of)
	}
	f.Overrides = append(f.Overrides, blankOverride())
	return f
}

func blankOverride() overrideForm { return overrideForm{Kind: "profile", Nums: map[string]string{}} }

// maxOverrideRows bounds the rows a posted form may carry.
const maxOverrideRows = 100

// readPolicyForm reads the posted form.
func readPolicyForm(pf url.Values) policyForm {
	version, _ := strconv.ParseInt(pf.Get("version"), 10, 64)
	f := policyForm{Version: version, Enabled: pf.Get("enabled") == "on", DryRun: pf.Get("dryRun") == "on",
		Action: pf.Get("action"), Nums: map[string]string{}, ExemptUsers: pf.Get("exemptUsers"),
		ExemptGroups: pf.Get("exemptGroups"), Reason: pf.Get("reason")}
	for id := range policyFields {
		f.Nums[id] = pf.Get(id)
	}
	rows, _ := strconv.Atoi(pf.Get("overrideRows"))
	for i := range min(max(rows, 0), maxOverrideRows) {
		p := "o" + strconv.Itoa(i) + "."
		o := overrideForm{Kind: pf.Get(p + "kind"), Name: pf.Get(p + "name"), Exempt: pf.Get(p+"exempt") == "on",
			Action: pf.Get(p + "action"), Nums: map[string]string{}}
		for _, ff := range overrideFields {
			o.Nums[ff.ID] = pf.Get(p + ff.ID)
		}
		f.Overrides = append(f.Overrides, o)
	}
	return f
}

// parseNumber reads text in unit u as API units; "" is 0.
func parseNumber(text string, u unit) (int64, bool) {
	text = strings.TrimSpace(text)
	if text == "" {
		return 0, true
	}
	x, err := strconv.ParseFloat(text, 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x*u.scale) > 1e15 || (u.whole && x != math.Trunc(x)) {
		return 0, false
	}
	return int64(math.Round(x * u.scale)), true
}

// splitNames reads a comma-separated list.
func splitNames(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// parsed is a form turned into a policy: the entries that are not numbers
// (or rows without a name) are errs, by form field id, and never reach the
// API; rowOf maps each override of the policy to its form row.
type parsed struct {
	policy v1.ReclaimPolicy
	errs   map[string]string
	rowOf  []int
}

// parsePolicyForm turns the typed form into a policy.
func parsePolicyForm(f policyForm) parsed {
	out := parsed{errs: map[string]string{}}
	p := &out.policy
	p.Version, p.Enabled, p.DryRun, p.Action = f.Version, f.Enabled, f.DryRun, v1.ReclaimAction(f.Action)
	for id, nf := range policyFields {
		n, ok := parseNumber(f.Nums[id], nf.unit)
		if !ok {
			out.errs[id] = "enter " + nf.unit.what
		}
		nf.set(p, n)
	}
	p.ExemptUsers, p.ExemptGroups = splitNames(f.ExemptUsers), splitNames(f.ExemptGroups)
	p.Reason = strings.TrimSpace(f.Reason)
	for i, of := range f.Overrides {
		if of.empty() {
			continue
		}
		prefix := "o" + strconv.Itoa(i) + "."
		o := v1.ReclaimOverride{Exempt: of.Exempt, Action: v1.ReclaimAction(of.Action)}
		name := strings.TrimSpace(of.Name)
		switch {
		case name == "":
			out.errs[prefix+"name"] = "name the profile or group this override is for"
		case of.Kind == "group":
			o.Group = name
		default:
			o.Profile = name
		}
		for _, ff := range overrideFields {
			n, ok := parseNumber(of.Nums[ff.ID], ff.unit)
			if !ok {
				out.errs[prefix+ff.ID] = "enter " + ff.unit.what
			}
			ff.set(&o, n)
		}
		p.Overrides = append(p.Overrides, o)
		out.rowOf = append(out.rowOf, i)
	}
	return out
}

// overrideProblem matches the API's names of an override's problems:
// "overrides[2]" and "overrides[2].warnSeconds".
var overrideProblem = regexp.MustCompile(`^overrides\[(\d+)\](?:\.(\w+))?$`)

// formID returns the form field that the API's field names, or "".
func (pp parsed) formID(api string) string {
	for id, nf := range policyFields {
		if nf.API == api {
			return id
		}
	}
	if _, ok := fieldLabels[api]; ok {
		return api
	}
	m := overrideProblem.FindStringSubmatch(api)
	if m == nil {
		return ""
	}
	j, err := strconv.Atoi(m[1])
	if err != nil || j >= len(pp.rowOf) {
		return ""
	}
	prefix := "o" + strconv.Itoa(pp.rowOf[j]) + "."
	switch m[2] {
	case "":
		return prefix + "name"
	case "profile", "group":
		return prefix + "name"
	case "action", "exempt":
		return prefix + m[2]
	}
	for _, ff := range overrideFields {
		if ff.API == m[2] {
			return prefix + ff.ID
		}
	}
	return prefix + "name"
}

// label names a form field for the error summary.
func label(id string, f policyForm) string {
	if nf, ok := policyFields[id]; ok {
		return nf.Label
	}
	if l, ok := fieldLabels[id]; ok {
		return l
	}
	row, field, ok := strings.Cut(strings.TrimPrefix(id, "o"), ".")
	i, err := strconv.Atoi(row)
	if !ok || err != nil || i >= len(f.Overrides) {
		return id
	}
	what := "Override " + strconv.Itoa(i+1)
	if n := strings.TrimSpace(f.Overrides[i].Name); n != "" {
		what += " (" + f.Overrides[i].Kind + " " + n + ")"
	}
	switch field {
	case "name":
		return what
	case "action":
		return what + ": action"
	}
	for _, ff := range overrideFields {
		if ff.ID == field {
			return what + ": " + ff.Label
		}
	}
	return what
}

// summary says an override row in one line, e.g. "group research: exempt".
func (o overrideForm) summary() string {
	var parts []string
	if o.Exempt {
		parts = append(parts, "exempt")
	}
	if o.Action != "" {
		parts = append(parts, "then "+o.Action)
	}
	for _, ff := range overrideFields {
		if v := strings.TrimSpace(o.Nums[ff.ID]); v != "" {
			parts = append(parts, fmt.Sprintf("%s %s", strings.ToLower(ff.Label), v))
		}
	}
	return o.Kind + " " + strings.TrimSpace(o.Name) + ": " + strings.Join(parts, ", ")
}
