// Package cliconfigtest is test support for binaries that declare a
// cliconfig.Table: it keeps the README's configuration table equal to the
// flag table, and makes the inputs of configuration tests (environments,
// kubeconfigs).
package cliconfigtest

import (
	"os"
	"path/filepath"
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

// Environ turns a map into os.Environ's form ("NAME=value" strings).
func Environ(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// DeadKubeconfig writes a kubeconfig in tb's temp dir that names an API
// server on a port nobody listens on (https://127.0.0.1:1) and returns its
// path: it loads, and every request to it fails at once.
func DeadKubeconfig(tb testing.TB) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "kubeconfig")
	err := os.WriteFile(p, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}
