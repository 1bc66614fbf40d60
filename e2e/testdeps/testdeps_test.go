package testdeps

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// runDeps runs .ci/deps (what `go tool task test` runs first) with PATH set
// to path only and returns its exit code and stderr.
func runDeps(t *testing.T, path string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("/bin/bash", append([]string{"../../.ci/deps"}, args...)...)
	cmd.Env = []string{"PATH=" + path}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	default:
		t.Fatalf("run .ci/deps: %v", err)
		return 0, ""
	}
}

// installedHere caches, per probe that does not depend on PATH (absolute
// paths, Python modules), whether this machine has it.
var installedHere sync.Map

// wantMissing lists the packages .ci/deps must name when PATH holds exactly
// the programs in onPath: every other PATH probe, and every absolute or
// Python probe that this machine lacks.
func wantMissing(onPath map[string]bool) []string {
	var pkgs []string
	for _, p := range Programs() {
		present := onPath[p.Probe]
		if strings.HasPrefix(p.Probe, "/") || strings.HasPrefix(p.Probe, "py:") {
			v, ok := installedHere.Load(p.Probe)
			if !ok {
				_, err := Find(p.Probe)
				v = err == nil
				installedHere.Store(p.Probe, v)
			}
			present = v.(bool)
		}
		if !present {
			pkgs = append(pkgs, p.Packages...)
		}
	}
	return pkgs
}

// TestDepsCheckFailsAtOnceNamingTheMissingPackages runs the test task's
// dependency check on a PATH without any of the listed programs (and
// without apt-get, so even as root it cannot install them): it must fail,
// naming every missing program with its package and the command that
// installs them all.
func TestDepsCheckFailsAtOnceNamingTheMissingPackages(t *testing.T) {
	for _, args := range [][]string{nil, {"--check"}} {
		code, stderr := runDeps(t, t.TempDir(), args...)
		if code != 1 {
			t.Fatalf(".ci/deps %v on an empty PATH: exit %d, want 1\n%s", args, code, stderr)
		}
		pkgs := wantMissing(nil)
		if want := "sudo apt-get install -y --no-install-recommends " + strings.Join(pkgs, " ") + "\n"; !strings.Contains(stderr, want) {
			t.Errorf(".ci/deps %v does not print %q:\n%s", args, want, stderr)
		}
		for _, p := range Programs() {
			if strings.HasPrefix(p.Probe, "/") || strings.HasPrefix(p.Probe, "py:") {
				continue
			}
			if !strings.Contains(stderr, "  "+p.Probe+" (Debian package "+strings.Join(p.Packages, " ")+"): "+p.Use+"\n") {
				t.Errorf(".ci/deps %v does not name %s with its package and use:\n%s", args, p.Probe, stderr)
			}
		}
	}
}

// TestDepsCheckPassesWhenEverythingIsThere gives every PATH program as an
// executable stub: the check passes, unless an absolute probe is missing on
// this machine, which it must then name.
func TestDepsCheckPassesWhenEverythingIsThere(t *testing.T) {
	dir := t.TempDir()
	onPath := map[string]bool{}
	for _, p := range Programs() {
		if strings.HasPrefix(p.Probe, "/") || strings.HasPrefix(p.Probe, "py:") {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, p.Probe), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		onPath[p.Probe] = true
	}
	code, stderr := runDeps(t, dir, "--check")
	if pkgs := wantMissing(onPath); len(pkgs) == 0 {
		if code != 0 || stderr != "" {
			t.Errorf(".ci/deps --check with everything present: exit %d, stderr %q; want 0 and silence", code, stderr)
		}
	} else if code != 1 || !strings.Contains(stderr, strings.Join(pkgs, " ")) {
		t.Errorf(".ci/deps --check: exit %d, want 1 naming %v:\n%s", code, pkgs, stderr)
	}
}

func TestFindNamesThePackageAndTheInstallCommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Find("gcc")
	if !errors.Is(err, ErrMissing) {
		t.Fatalf("Find(gcc) on an empty PATH = %v, want ErrMissing", err)
	}
	for _, want := range []string{"gcc is not installed", "Debian package gcc", "sudo apt-get install -y gcc", "go tool task test", "-short"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := Find("py:jupyterhub"); err != nil && !strings.Contains(err.Error(), "sudo apt-get install -y jupyterhub") {
		t.Errorf("Find(py:jupyterhub) = %v, want it found or the install command", err)
	}
	if _, err := Find("not-a-listed-program"); err == nil || errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "e2e/testdeps/packages") {
		t.Errorf("Find of an unlisted program = %v, want an error naming the list", err)
	}
}

// TestTheTestTaskAndCIRunTheCheck keeps the one list in use: the test task
// and .ci/run both run .ci/deps, and .ci/run lists no packages of its own.
func TestTheTestTaskAndCIRunTheCheck(t *testing.T) {
	task, err := os.ReadFile("../../Taskfile.yml")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(task), ".ci/deps") {
		t.Error("Taskfile.yml does not run .ci/deps")
	}
	if !strings.Contains(string(ci), ".ci/deps") || strings.Contains(string(ci), "apt-get install") {
		t.Error(".ci/run must install through .ci/deps, with no package list of its own")
	}
}
