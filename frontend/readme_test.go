package frontend

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestREADMEDescribesEveryPage keeps the README's "Web pages" table true:
// every page (GET route) has a row, and every row outside /auth/ (the
// web login's pages, served by package auth) and /user/ (the notebook's
// page, Handler.Notebook, served through the notebook proxy) is a page.
func TestREADMEDescribesEveryPage(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Web pages\n")
	if !ok {
		t.Fatal(`README.md has no "## Web pages" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var described []string
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range code.FindAllStringSubmatch(first, -1) {
			described = append(described, m[1])
		}
	}
	pages := []string{"/"} // the redirect to /servers
	for _, rt := range pageRoutes {
		if p, ok := strings.CutPrefix(rt.pattern, "GET "); ok {
			pages = append(pages, p)
		}
	}
	for _, p := range pages {
		if !slices.Contains(described, p) {
			t.Errorf("the page %s has no row in README.md's Web pages table", p)
		}
	}
	for _, p := range described {
		if !strings.HasPrefix(p, "/auth/") && !strings.HasPrefix(p, "/user/") && !slices.Contains(pages, p) {
			t.Errorf("README.md's Web pages table describes %s, which is not a page", p)
		}
	}
}
