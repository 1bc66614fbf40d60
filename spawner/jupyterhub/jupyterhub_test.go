package jupyterhub_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/spawner/jupyterhub/pytest"
)

// TestPytest runs the class's whole Python suite against the fake broker
// (the contract tests run against the real broker in e2e).
func TestPytest(t *testing.T) {
	py := pytest.Python(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := pytest.Run(ctx, py, []string{"GPUBROKER_TEST_URL="})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("pytest: %s", lastLine(out))
}

// checkEntryPoint runs inside the venv: the hub's own trait resolves the
// entry point name, and the class comes from the installed copy.
const checkEntryPoint = `
import sys
from importlib.metadata import version
from jupyterhub.app import JupyterHub
import gpubroker_jupyterhub
app = JupyterHub()
app.spawner_class = "gpubroker"
assert app.spawner_class is gpubroker_jupyterhub.GPUBrokerSpawner, app.spawner_class
assert gpubroker_jupyterhub.__file__.startswith(sys.prefix), gpubroker_jupyterhub.__file__
print(version("gpubroker-jupyterhub"), gpubroker_jupyterhub.__file__)
`

// TestPackageInstallsAndTheHubFindsIt installs the package the way a hub
// image does without PyPI: a venv that sees Debian's
// packages, pip without an index or build isolation; then JupyterHub must
// resolve c.JupyterHub.spawner_class = "gpubroker" to the class.
func TestPackageInstallsAndTheHubFindsIt(t *testing.T) {
	py := pytest.Python(t, "venv", "ensurepip", "setuptools", "wheel")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	// pip builds in the source tree (build/, *.egg-info): build a copy.
	src := filepath.Join(tmp, "src")
	modules, err := filepath.Glob(filepath.Join(pytest.Dir(), "gpubroker_jupyterhub", "*.py"))
	if err != nil || len(modules) == 0 {
		t.Fatalf("no modules in the package (%v)", err)
	}
	for _, from := range append(modules, filepath.Join(pytest.Dir(), "pyproject.toml"), filepath.Join(pytest.Dir(), "README.md")) {
		rel, err := filepath.Rel(pytest.Dir(), from)
		if err != nil {
			t.Fatal(err)
		}
		copyFile(t, from, filepath.Join(src, rel))
	}
	venv := filepath.Join(tmp, "venv")
	run(t, ctx, tmp, py, "-m", "venv", "--system-site-packages", venv)
	vpy := filepath.Join(venv, "bin", "python")
	run(t, ctx, tmp, vpy, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--disable-pip-version-check", "--no-input", "-q", src)
	out := run(t, ctx, tmp, vpy, "-c", checkEntryPoint)
	if !strings.HasPrefix(out, "0.1.0 ") {
		t.Errorf("installed package: %q, want version 0.1.0 and its path", out)
	}
}

func run(t *testing.T, ctx context.Context, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PIP_NO_CACHE_DIR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
