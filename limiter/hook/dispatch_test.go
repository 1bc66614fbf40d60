package hook_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// TestDlsymInterposition: dlsym on the driver's handle hands out the hook
// for a hooked symbol and the driver's own function otherwise, RTLD_NEXT
// still resolves relative to the caller, and dlvsym (interposed like dlsym,
// for drivers with versioned symbols) still finds versioned symbols.
func TestDlsymInterposition(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	r, _ := dev.run(f, slice{MemoryMiB: 64, ComputePercent: 100}, false, "dlcheck")
	if fmt.Sprint(r[0].Vals) != "[1 1 1 1]" {
		t.Errorf("dlcheck = %v, want [1 1 1 1] (hooked symbol -> hook, other -> driver, RTLD_NEXT -> libc, dlvsym -> libc)", r[0].Vals)
	}
}

// TestCRegionParsersFuzz runs the hook's C parsers of the quota and usage
// region images under AddressSanitizer and UBSan over 200,000 corrupt inputs
// each (bounded, for CI; `task limiter:fuzz` runs longer).
func TestCRegionParsersFuzz(t *testing.T) {
	t.Parallel()
	needBuild(t)
	out, err := exec.Command(filepath.Join(buildDir(), "fuzz_regions"), "200000", "42").CombinedOutput()
	if err != nil {
		t.Fatalf("fuzz_regions: %v\n%s", err, out)
	}
	var n, quota, usage int
	if _, err := fmt.Sscanf(string(out), "fuzz_regions %d %d %d", &n, &quota, &usage); err != nil || n != 200000 {
		t.Fatalf("fuzz_regions output %q: %v", out, err)
	}
	for name, accepted := range map[string]int{"quota": quota, "usage": usage} {
		if accepted == 0 || accepted == n {
			t.Errorf("fuzz_regions accepted %d of %d %s inputs: the mutator does not exercise both outcomes", accepted, n, name)
		}
	}
}

// TestHookIsQuietInNonGPUPrograms: loaded into every process of a pod, the
// hook must not disturb programs that never touch the GPU, even with no
// quota at all (outside a pod: fail-closed state): they run, exit 0 and
// print nothing.
func TestHookIsQuietInNonGPUPrograms(t *testing.T) {
	t.Parallel()
	needBuild(t)
	tests := []struct {
		name string
		argv []string
	}{
		{name: "shell pipeline", argv: []string{"/bin/sh", "-c", "ls / | wc -l >/dev/null && echo ok >/dev/null"}},
		{name: "dlsym-heavy interpreter", argv: []string{"python3", "-c", "import ctypes, json, ssl; ctypes.CDLL(None).getpid()"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin := tc.argv[0]
			if !filepath.IsAbs(bin) {
				bin = testdeps.Need(t, bin)
			}
			cmd := exec.Command(bin, tc.argv[1:]...)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LD_PRELOAD=" + filepath.Join(buildDir(), "libgpulimit.so")}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v with the hook: %v\n%s", tc.argv, err, stderr.String())
			}
			if stderr.Len() != 0 {
				t.Errorf("%v with the hook printed on stderr:\n%s", tc.argv, stderr.String())
			}
		})
	}
}
