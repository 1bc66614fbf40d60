package hook_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDlsymInterposition: dlsym on the driver's handle hands out the hook
// for a hooked symbol and the driver's own function otherwise, and
// RTLD_NEXT still resolves relative to the caller.
func TestDlsymInterposition(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	r, _ := dev.run(f, slice{MemoryMiB: 64, ComputePercent: 100}, false, "dlcheck")
	if fmt.Sprint(r[0].Vals) != "[1 1 1]" {
		t.Errorf("dlcheck = %v, want [1 1 1] (hooked symbol -> hook, other -> driver, RTLD_NEXT -> libc)", r[0].Vals)
	}
}

// TestCQuotaParserFuzz runs the C quota parser under AddressSanitizer and
// UBSan over 200,000 corrupt inputs (bounded, for CI; `task limiter:fuzz`
// runs longer).
func TestCQuotaParserFuzz(t *testing.T) {
	t.Parallel()
	needBuild(t)
	out, err := exec.Command(filepath.Join(buildDir(), "fuzz_quota"), "200000", "42").CombinedOutput()
	if err != nil {
		t.Fatalf("fuzz_quota: %v\n%s", err, out)
	}
	var n, accepted int
	if _, err := fmt.Sscanf(string(out), "fuzz_quota %d %d", &n, &accepted); err != nil || n != 200000 {
		t.Fatalf("fuzz_quota output %q: %v", out, err)
	}
	if accepted == 0 || accepted == n {
		t.Errorf("fuzz_quota accepted %d of %d inputs: the mutator does not exercise both outcomes", accepted, n)
	}
}
