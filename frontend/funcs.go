package frontend

import (
	"html/template"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// funcs are the templates' functions.
var funcs = template.FuncMap{
	"gib":        formatMiB,
	"gibNumber":  gibNumber,
	"stateLabel": stateLabel,
	"when":       when,
	"path":       url.PathEscape,
	"keys":       func(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) },
	"join":       strings.Join,
	"add":        func(a, b int) int { return a + b },
	"seconds": func(s int64) string {
		return (time.Duration(s) * time.Second).String()
	},
}

// formatMiB writes a MiB count the way people read it: "512 MiB", "8 GiB",
// "140.4 GiB".
func formatMiB(mib int64) string {
	if mib < 1024 {
		return strconv.FormatInt(mib, 10) + " MiB"
	}
	g := float64(mib) / 1024
	if mib%1024 == 0 {
		return strconv.FormatInt(mib/1024, 10) + " GiB"
	}
	return strconv.FormatFloat(g, 'f', 1, 64) + " GiB"
}

// stateLabel says a lifecycle state in words.
func stateLabel(s v1.ServerState) string {
	switch s {
	case v1.StatePending:
		return "Waiting to start"
	case v1.StatePlacing:
		return "Finding room on a GPU"
	case v1.StateCreating:
		return "Creating the notebook pod"
	case v1.StateStarting:
		return "Starting the notebook"
	case v1.StateRunning:
		return "Running"
	case v1.StateStopping:
		return "Stopping"
	case v1.StateStopped:
		return "Stopped"
	case v1.StateFailed:
		return "Failed"
	}
	return capitalize(string(s))
}

// when formats a time for people, in UTC.
func when(t any) string {
	switch x := t.(type) {
	case time.Time:
		if x.IsZero() {
			return ""
		}
		return x.UTC().Format("2006-01-02 15:04 UTC")
	case *time.Time:
		if x == nil {
			return ""
		}
		return when(*x)
	}
	return ""
}

// capitalize upper-cases the first letter of s.
func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	return string(unicode.ToUpper(r)) + s[n:]
}
