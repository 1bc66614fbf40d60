package cliconfig

import (
	"fmt"
	"log/slog"
	"strings"
)

// defaultText is a flag's default as --help shows it: DefaultDoc, else the
// quoted Default, else "none" (false for a boolean).
func defaultText(f Flag) string {
	switch {
	case f.DefaultDoc != "":
		return f.DefaultDoc
	case f.Default != "":
		if _, ok := f.Value.(boolValue); ok {
			return f.Default
		}
		return fmt.Sprintf("%q", f.Default)
	default:
		if _, ok := f.Value.(boolValue); ok {
			return "false"
		}
		return "none"
	}
}

// Usage returns the --help text: the summary, how flags and variables
// combine, then every flag with its placeholder, help, variable and default.
func (t *Table) Usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s [flags]\n\n%s\n", t.Program, strings.TrimSpace(t.Summary))
	fmt.Fprintf(&b, "\nEvery flag can also be set by the environment variable shown; a flag beats\nits variable, which beats the default. Durations look like 30s, 2m, 1h.\n\nFlags:\n")
	for _, f := range t.Flags {
		head := "  --" + f.Name
		if _, ok := f.Value.(boolValue); !ok && f.Placeholder != "" {
			head += " " + f.Placeholder
		}
		fmt.Fprintf(&b, "%s\n      %s\n      env %s, default %s\n", head, f.Help, t.EnvName(f.Name), defaultText(f))
	}
	fmt.Fprintf(&b, "  --help\n      Print this help and exit.\n  --version\n      Print the version and build information and exit.\n")
	return b.String()
}

// Markdown returns the README's configuration table: a header and one row
// per flag (flag, environment variable, default, meaning).
func (t *Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
	for _, f := range t.Flags {
		def := f.DefaultDoc
		switch _, isBool := f.Value.(boolValue); {
		case def != "":
		case f.Default != "":
			def = "`" + f.Default + "`"
		case isBool:
			def = "`false`"
		}
		fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s |\n", f.Name, t.EnvName(f.Name), cell(def), cell(f.Help))
	}
	return b.String()
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// LogValue returns every flag's current value for a log line, keyed by the
// flag's name with '_' for '-', each passed through its Redact.
func (t *Table) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, len(t.Flags))
	for _, f := range t.Flags {
		v := f.Value.String()
		if f.Redact != nil {
			v = f.Redact(v)
		}
		attrs = append(attrs, slog.String(strings.ReplaceAll(f.Name, "-", "_"), v))
	}
	return slog.GroupValue(attrs...)
}

// The markers around a generated table in a Markdown document: an HTML
// comment each, invisible when rendered.
const (
	markdownBegin = "<!-- flags: %s (generated from the flag table; the test rewrites it with -update) -->\n"
	markdownEnd   = "<!-- end of flags: %s -->\n"
)

// ReplaceMarkdown returns doc with the table between the markers of id
// replaced by table, and the table found there. ok is false when doc has no
// such markers.
func ReplaceMarkdown(doc, id, table string) (out, found string, ok bool) {
	begin, end := fmt.Sprintf(markdownBegin, id), fmt.Sprintf(markdownEnd, id)
	i := strings.Index(doc, begin)
	if i < 0 {
		return doc, "", false
	}
	j := strings.Index(doc[i+len(begin):], end)
	if j < 0 {
		return doc, "", false
	}
	j += i + len(begin)
	return doc[:i+len(begin)] + table + doc[j:], doc[i+len(begin) : j], true
}

// MarkdownMarkers returns the begin and end markers of id, to paste around
// a table in a document.
func MarkdownMarkers(id string) (begin, end string) {
	return fmt.Sprintf(markdownBegin, id), fmt.Sprintf(markdownEnd, id)
}
