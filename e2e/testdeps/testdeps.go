package testdeps

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

//go:embed packages
var list string

// Program is one line of the package list.
type Program struct {
	// Probe is what proves the program is installed: a name looked up on
	// PATH, or an absolute path that must exist.
	Probe string
	// Packages are the Debian packages that provide it (at least one).
	Packages []string
	// Use says what in the suite needs it.
	Use string
}

// Programs returns the package list in file order.
func Programs() []Program {
	var out []Program
	for _, line := range strings.Split(list, "\n") {
		use := ""
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line, use = line[:i], strings.TrimSpace(line[i+1:])
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		out = append(out, Program{Probe: f[0], Packages: f[1:], Use: use})
	}
	return out
}

// Python is the interpreter py: probes import with: Debian's, which sees
// Debian's packages (a python3 on PATH may be another one).
const Python = "/usr/bin/python3"

// ErrMissing is wrapped by Find when a program is not installed.
var ErrMissing = errors.New("not installed")

// Find returns the path of the program listed with probe (a PATH name such
// as "gcc", an absolute path such as "/usr/bin/redis-server", or py:<module>
// for Python modules, whose path is Python). The error
// wraps ErrMissing and names the Debian package and the command that
// installs it; a probe that is not in the list is an error too, so the list
// stays complete.
func Find(probe string) (string, error) {
	var prog *Program
	for _, p := range Programs() {
		if p.Probe == probe || pyModuleOf(probe, p.Probe) {
			prog = &p
			break
		}
	}
	if prog == nil {
		return "", fmt.Errorf("testdeps: %q is not in e2e/testdeps/packages; add a line for it", probe)
	}
	var path string
	var err error
	switch {
	case strings.HasPrefix(probe, "py:"):
		path = Python
		if out, perr := exec.Command(Python, "-c", "import "+strings.TrimPrefix(probe, "py:")).CombinedOutput(); perr != nil {
			err = fmt.Errorf("%s cannot import it: %w: %s", Python, perr, lastLine(out))
		}
	case strings.HasPrefix(probe, "/"):
		path = probe
		_, err = os.Stat(probe)
	default:
		path, err = exec.LookPath(probe)
	}
	if err != nil {
		pkgs := strings.Join(prog.Packages, " ")
		return "", fmt.Errorf("%s is %w (Debian package %s, for %s): install it with `sudo apt-get install -y %s`, or run `go tool task test` as root, which installs it; `go test -short` skips what needs it: %w",
			probe, ErrMissing, pkgs, prog.Use, pkgs, err)
	}
	return path, nil
}

// Need returns the path of the program listed with probe. When it is
// missing it fails tb with Find's message, or skips tb under -short.
func Need(tb testing.TB, probe string) string {
	tb.Helper()
	path, err := Find(probe)
	if err == nil {
		return path
	}
	if testing.Short() && errors.Is(err, ErrMissing) {
		tb.Skipf("-short: %v", err)
	}
	tb.Fatal(err)
	return ""
}

// pyModuleOf reports whether probe is py:<one module> and listed names it
// among its modules (py:venv is on the line py:venv,ensurepip).
func pyModuleOf(probe, listed string) bool {
	m, ok := strings.CutPrefix(probe, "py:")
	mods, listedPy := strings.CutPrefix(listed, "py:")
	return ok && listedPy && !strings.Contains(m, ",") && slices.Contains(strings.Split(mods, ","), m)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
