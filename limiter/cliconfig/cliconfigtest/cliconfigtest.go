// Package cliconfigtest is test support for binaries that declare a
// cliconfig.Table: it keeps the README's configuration table equal to the
// flag table.
package cliconfigtest

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

// CheckMarkdown fails tb unless the Markdown file at path holds, between the
// markers of id (cliconfig.MarkdownMarkers), exactly t.Markdown(). With
// update it rewrites the file instead (go test -update).
func CheckMarkdown(tb testing.TB, path, id string, t *cliconfig.Table, update bool) {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	want := t.Markdown()
	out, found, ok := cliconfig.ReplaceMarkdown(string(b), id, want)
	if !ok {
		begin, end := cliconfig.MarkdownMarkers(id)
		tb.Fatalf("%s has no table %q: put these two lines around it (go test -update fills it in):\n%s%s", path, id, begin, end)
	}
	if update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			tb.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(want, found); diff != "" {
		tb.Errorf("%s: table %q differs from the flags (-flags +%s); run go test -update:\n%s", path, id, path, diff)
	}
}
