// Package pytest runs the Python tests of gpubroker's JupyterHub spawner
// class (the package in spawner/jupyterhub) from Go tests, with Debian's
// interpreter, so that `go tool task test` runs them. It is a test helper:
// only tests import it.
//
// The interpreter is always /usr/bin/python3: the python3 on PATH may be
// another one that cannot import Debian's jupyterhub.
package pytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// Interpreter is the Python that runs the class: Debian's, which sees
// Debian's jupyterhub, aiohttp, pytest and pytest-asyncio.
const Interpreter = "/usr/bin/python3"

// Modules are what the suite imports, each listed with its Debian package
// in e2e/testdeps/packages (as py:<module>).
var Modules = []string{"jupyterhub", "aiohttp", "pytest", "pytest_asyncio"}

// Python returns Interpreter once it has checked that it can import
// Modules and the extra probes named (as e2e/testdeps/packages lists them:
// "venv,ensurepip", "setuptools", "wheel"). When it cannot, the test fails
// naming the Debian packages and the command that installs them; only
// under -short is it skipped (e2e/testdeps).
func Python(t testing.TB, extra ...string) string {
	t.Helper()
	for _, m := range append(append([]string{}, Modules...), extra...) {
		testdeps.Need(t, "py:"+m)
	}
	return Interpreter
}

// Dir is the directory of the Python package (spawner/jupyterhub), found
// from this file's path, so tests in any package can use it.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Run runs python -m pytest on the package's tests in Dir with args
// appended (for example "-m", "contract") and env added to the process
// environment. It returns pytest's combined output, and an error when
// pytest did not pass: a failure, an error, or no test selected (exit 5).
// Python writes no bytecode into the source tree.
func Run(ctx context.Context, python string, env []string, args ...string) (string, error) {
	argv := append([]string{"-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", "tests"}, args...)
	cmd := exec.CommandContext(ctx, python, argv...)
	cmd.Dir = Dir()
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", python, strings.Join(argv, " "), err)
	}
	return string(out), nil
}
