package httpapi

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestREADMEAPITableIsTheDocument keeps the README's "API overview" table
// true: every operation of openapi.yaml has a row ("GET /path", or
// "`GET`, `PUT /path`" for two methods of one path) and every row names
// operations the document has.
func TestREADMEAPITableIsTheDocument(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(openapiYAML)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, method+" "+path)
		}
	}
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## API overview\n")
	if !ok {
		t.Fatal(`README.md has no "## API overview" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	code := regexp.MustCompile("`([^`]+)`")
	var described []string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		var methods []string // those written alone, before the path they share
		for _, m := range code.FindAllStringSubmatch(first, -1) {
			method, path, ok := strings.Cut(m[1], " ")
			if !ok {
				methods = append(methods, m[1])
				continue
			}
			for _, mm := range append(methods, method) {
				described = append(described, mm+" "+path)
			}
			methods = nil
		}
	}
	for _, op := range ops {
		if !slices.Contains(described, op) {
			t.Errorf("%s (openapi.yaml) has no row in README.md's API overview table", op)
		}
	}
	for _, op := range described {
		if !slices.Contains(ops, op) {
			t.Errorf("README.md's API overview table names %s, which openapi.yaml does not have", op)
		}
	}
}
