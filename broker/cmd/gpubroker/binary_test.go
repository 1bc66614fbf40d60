package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// denied are packages the production broker must not link: simulation and
// test support. A path matches an entry equal to it or under it ("/...").
var denied = []string{
	"testing", "net/http/httptest",
	"github.com/alicebob/miniredis/v2/...",                // the embedded Redis of dev mode
	"github.com/NVIDIA/go-nvml/...",                       // NVML and its mocks: the agent's, with cgo
	"k8s.io/client-go/kubernetes/fake/...",                // the fake clientset
	"github.com/gpubroker/gpubroker/broker/devissuer/...", // token minting
	"github.com/gpubroker/gpubroker/broker/redistest/...",
	"github.com/gpubroker/gpubroker/broker/internal/app/dev/...",
	"github.com/gpubroker/gpubroker/spawner/devcluster/...",
	"github.com/gpubroker/gpubroker/limiter/agent",    // the agent itself (agentstore, its Redis contract, is allowed)
	"github.com/gpubroker/gpubroker/limiter/hook/...", // the C hook's test support
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest/...",
	"github.com/gpubroker/gpubroker/e2e/...",
	"github.com/gpubroker/gpubroker/deploy/...", // the chart's test helpers
	"helm.sh/...", // the Helm SDK they link
	"go.uber.org/goleak/...", "github.com/google/go-cmp/...", "github.com/chromedp/...",
}

// allowedOnlyVia are packages client-go links for its own generated code,
// which the broker may carry only through that importer.
var allowedOnlyVia = map[string]string{
	// gentype, the base of every typed client, holds the fake clients' list
	// helpers next to the real ones; nothing of ours imports it.
	"k8s.io/client-go/testing": "k8s.io/client-go/gentype",
}

func deniedBy(path string) string {
	for _, d := range denied {
		if base, tree := strings.CutSuffix(d, "/..."); tree && (path == base || strings.HasPrefix(path, base+"/")) || path == d {
			return d
		}
	}
	if strings.Contains(path, "/fake/") || strings.HasSuffix(path, "/fake") {
		return "any .../fake package"
	}
	return ""
}

// goList runs `go list -deps` on pkg with env added and returns its lines.
func goList(t *testing.T, pkg string, env []string, format string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", format, pkg)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestProductionBinaryLinksNoSimulation checks gpubroker's dependency list
// (go list -deps) against the deny list: no embedded Redis, fake clientset,
// NVML or its mocks, httptest, testing, token minting or dev composition.
func TestProductionBinaryLinksNoSimulation(t *testing.T) {
	importers := map[string][]string{}
	lines := goList(t, ".", []string{"CGO_ENABLED=0"}, `{{.ImportPath}} {{join .Imports " "}}`)
	for _, line := range lines {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			importers[imp] = append(importers[imp], f[0])
		}
	}
	t.Logf("gpubroker links %d packages", len(lines))
	for _, line := range lines {
		pkg := strings.Fields(line)[0]
		if via, ok := allowedOnlyVia[pkg]; ok {
			for _, by := range importers[pkg] {
				if by != via {
					t.Errorf("%s is imported by %s; only %s may import it", pkg, by, via)
				}
			}
			continue
		}
		if d := deniedBy(pkg); d != "" {
			t.Errorf("gpubroker links %s (denied: %s), imported by %v", pkg, d, importers[pkg])
		}
	}
}

// TestProductionBinaryNeedsNoCgo checks that no package of gpubroker has
// cgo files besides the standard library's optional ones. That it builds
// with CGO_ENABLED=0 is deploy/images' TestBrokerImage, which builds the
// image's binary so and reads its build settings.
func TestProductionBinaryNeedsNoCgo(t *testing.T) {
	for _, line := range goList(t, ".", []string{"CGO_ENABLED=1"}, `{{if .CgoFiles}}{{.ImportPath}} {{.Standard}}{{end}}`) {
		if f := strings.Fields(line); len(f) == 2 && f[1] != "true" {
			t.Errorf("gpubroker links %s, which needs cgo", f[0])
		}
	}
}

// TestDenyListCatchesDevMode runs the deny list over gpubroker-dev, which
// links every simulated part: the check must see them.
func TestDenyListCatchesDevMode(t *testing.T) {
	seen := map[string]bool{}
	for _, pkg := range goList(t, "../gpubroker-dev", nil, "{{.ImportPath}}") {
		if d := deniedBy(pkg); d != "" {
			seen[d] = true
		}
	}
	for _, want := range []string{"github.com/alicebob/miniredis/v2/...", "github.com/NVIDIA/go-nvml/...", "k8s.io/client-go/kubernetes/fake/...",
		"github.com/gpubroker/gpubroker/broker/devissuer/...", "github.com/gpubroker/gpubroker/spawner/devcluster/...",
		"github.com/gpubroker/gpubroker/limiter/agent", "github.com/gpubroker/gpubroker/broker/internal/app/dev/...", "net/http/httptest"} {
		if !seen[want] {
			t.Errorf("the deny list does not catch %s in gpubroker-dev", want)
		}
	}
}
