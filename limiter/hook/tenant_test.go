package hook_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/region"
)

// The hostile-tenant cases. The notebook user controls its environment, its
// argv, every file it can write and how it loads libraries, and may be root
// in its container (without capabilities, as the pod runs it): nothing of
// that may widen the slice (ARCHITECTURE.md invariant 3). Each case runs the
// production libgpulimit.so under podrun, the slice's quota mounted read-only
// and its usage directory read-write at the fixed in-pod paths, and checks on
// the stub driver that the slice's processes together hold no more than the
// slice, or that they fail closed. Each test has its own device and deadline.

const (
	capMiB        = 64    // the slice
	wideMiB       = 30720 // what the tenant asks for
	tenantUID     = 65534 // a tenant that is not root
	tenantTimeout = 90 * time.Second
)

// fakeQuota writes, in a directory anyone can read, a valid quota region for
// the test's slice id that grants wideMiB: what a tenant would offer the hook.
func fakeQuota(t *testing.T) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "quota.bin")
	if err := region.WriteQuota(path, region.Quota{Generation: 1 << 40, SliceID: "test-slice", MemoryLimitBytes: wideMiB * mib,
		ComputePercent: 100, ComputeLimitPercent: 100}); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// capSlice is a fresh device with the test's deadline and one slice of capMiB,
// its first quota written.
func capSlice(t *testing.T) (*device, sliceFiles) {
	t.Helper()
	dev := newDevice(t)
	dev.within(tenantTimeout)
	f := dev.newSlice("s")
	dev.initialQuota(f, slice{MemoryMiB: capMiB, ComputePercent: 100})
	return dev, f
}

// held sums what the stub driver holds for the processes.
func held(dev *device, procs ...*proc) uint64 {
	st := dev.stub()
	var sum uint64
	for _, p := range procs {
		sum += st.procMem(p.pid())
	}
	return sum
}

// fillAll has every process fill with 1 MiB blocks at the same time, then
// returns each one's reply.
func fillAll(t *testing.T, procs ...*proc) []reply {
	t.Helper()
	for _, p := range procs {
		if _, err := fmt.Fprintf(p.stdin, "fill linear %d\n", mib); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	out := make([]reply, len(procs))
	for i, p := range procs {
		out[i] = p.next(30 * time.Second)
	}
	return out
}

// checkWithinCap fails the test if the processes together hold more than the
// slice; with full, also if they did not fill it (the cap still works).
func checkWithinCap(t *testing.T, dev *device, full bool, procs ...*proc) {
	t.Helper()
	sum := held(dev, procs...)
	if sum > capMiB*mib {
		t.Errorf("the slice's processes hold %d MiB together, more than its %d MiB", sum/mib, capMiB)
	}
	if full && sum < (capMiB-2)*mib {
		t.Errorf("the slice's processes hold %d MiB together: the %d MiB slice was refused before it was full", sum/mib, capMiB)
	}
}

// TestTenantEnvironmentCannotWidenTheSlice sets every variable a hook ever
// read, or a test build might read, to wider values in the slice's processes:
// two of them together still hold exactly the slice, see its size as their
// total, and account in the slice's own usage region.
func TestTenantEnvironmentCannotWidenTheSlice(t *testing.T) {
	t.Parallel()
	dir, fake := fakeQuota(t)
	fakeUsage := filepath.Join(dir, "usage.bin")
	if err := region.CreateUsage(fakeUsage); err != nil {
		t.Fatal(err)
	}
	sets := map[string][]string{
		"limit variables": {"GPUBROKER_MEMORY_LIMIT_MIB=30720", "GPUBROKER_COMPUTE_PERCENT=100", "GPUBROKER_COMPUTE_LIMIT_PERCENT=100"},
		"path variables":  {"GPUBROKER_QUOTA_FILE=" + fake, "GPUBROKER_USAGE_FILE=" + fakeUsage},
		"identity variables": {"GPUBROKER_SLICE_ID=other-slice", "GPUBROKER_GPU_UUID=GPU-00000000-0000-0000-0000-000000000000",
			"GPUBROKER_SPAWN_ID=other-slice"},
		"test-build names": {"GPUBROKER_TEST_QUOTA_FILE=" + fake, "GPUBROKER_TEST_USAGE_FILE=" + fakeUsage,
			"GPUBROKER_QUOTA_DIR=" + dir, "GPUBROKER_USAGE_DIR=" + dir, "GPUBROKER_STUB_MEMORY_MIB=999999"},
		"log level": {"GPUBROKER_LIMITER_LOG=debug"},
	}
	var all []string
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		all = append(all, sets[name]...)
	}
	sets["all at once"] = all
	for name, env := range sets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dev, f := capSlice(t)
			a, b := dev.startAs(f, procOpts{env: env}), dev.startAs(f, procOpts{env: env})
			for i, r := range fillAll(t, a, b) {
				if r.Res != cudaOutOfMemory {
					t.Errorf("process %d: fill ended with CUresult %d, want out of memory", i, r.Res)
				}
			}
			checkWithinCap(t, dev, true, a, b)
			if mi := a.do("meminfo"); mi.Vals[1] != capMiB*mib {
				t.Errorf("cuMemGetInfo total %d MiB, want the slice's %d", mi.Vals[1]/mib, capMiB)
			}
			u, err := region.ReadUsage(f.Usage)
			if err != nil {
				t.Fatal(err)
			}
			if got := u.BytesInUse(dev.stub().UUID); got != held(dev, a, b) {
				t.Errorf("the slice's usage region charges %d MiB, the driver holds %d MiB", got/mib, held(dev, a, b)/mib)
			}
			if fu, err := region.ReadUsage(fakeUsage); err != nil || len(fu.Processes) != 0 {
				t.Errorf("the tenant's own usage file was used: %+v, %v", fu, err)
			}
		})
	}
}

// TestProductionHookReadsNoPathOrLimitVariable: the only GPUBROKER_ name in
// the production library is the log level; nothing else can be read from the
// environment, so no variable can choose a file or a limit.
func TestProductionHookReadsNoPathOrLimitVariable(t *testing.T) {
	t.Parallel()
	needBuild(t)
	b, err := os.ReadFile(filepath.Join(buildDir(), "libgpulimit.so"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`GPUBROKER_[A-Z0-9_]+`).FindAll(b, -1) {
		names[string(m)] = true
	}
	want := []string{"GPUBROKER_LIMITER_LOG"}
	if got := slices.Sorted(maps.Keys(names)); !slices.Equal(got, want) {
		t.Errorf("libgpulimit.so names the variables %v, want only %v", got, want)
	}
}

// TestTenantQuotaFileThroughEveryWritablePath offers a self-made quota file
// for the right slice id, granting 30 GiB, through every place a tenant can
// write or point at, as root in the container and as another uid: the
// slice's cap holds, or the hook fails closed.
func TestTenantQuotaFileThroughEveryWritablePath(t *testing.T) {
	t.Parallel()
	fakeDir, fake := fakeQuota(t)
	const pod = "/var/run/gpubroker"
	tests := []struct {
		name   string
		uid    int
		before string   // run inside the pod's mounts before the process starts
		env    []string // the process's environment
		// closed: the process fails closed (it never sees a valid quota);
		// else the slice's own quota stays in force.
		closed bool
		why    string // in the process's stderr when closed
	}{
		{name: "written into the read-only quota directory, as root", before: "cp " + fake + " " + pod + "/quota/quota.bin || true"},
		{name: "written into the usage directory and named by a variable, as root",
			before: "cp " + fake + " " + pod + "/usage/quota.bin", env: []string{"GPUBROKER_QUOTA_FILE=" + pod + "/usage/quota.bin"}},
		{name: "a writable directory in place of the mounts, as root",
			before: "mv /run/gpubroker /run/gpubroker.real && mkdir -p " + pod + "/quota && cp " + fake + " " + pod + "/quota/ && ln -s /run/gpubroker.real/usage " + pod + "/usage",
			closed: true, why: "is not on a read-only mount"},
		{name: "a symbolic link in place of the quota directory, as root",
			before: "mv /run/gpubroker /run/gpubroker.real && mkdir " + pod + " && ln -s " + fakeDir + " " + pod + "/quota && ln -s /run/gpubroker.real/usage " + pod + "/usage",
			closed: true, why: "is not on a read-only mount"},
		{name: "a symbolic link in place of the quota file, as root",
			before: "mv /run/gpubroker /run/gpubroker.real && mkdir -p " + pod + "/quota && ln -s " + fake + " " + pod + "/quota/quota.bin && ln -s /run/gpubroker.real/usage " + pod + "/usage",
			closed: true, why: "is a symbolic link"},
		{name: "every one of them, as a tenant that is not root", uid: tenantUID,
			before: "cp " + fake + " " + pod + "/quota/quota.bin; cp " + fake + " " + pod + "/usage/quota.bin; mv /run/gpubroker /run/x; ln -s " + fakeDir + " " + pod + "/q; true",
			env:    []string{"GPUBROKER_QUOTA_FILE=" + pod + "/usage/quota.bin"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.uid > 0 {
				needRoot(t)
			}
			dev, f := capSlice(t)
			p := dev.startAs(f, procOpts{uid: tc.uid, before: tc.before, env: tc.env})
			r := p.do(fmt.Sprintf("fill linear %d", mib))
			if r.Res != cudaOutOfMemory {
				t.Fatalf("fill ended with CUresult %d, want out of memory", r.Res)
			}
			if tc.closed {
				if got := held(dev, p); got != 0 {
					t.Errorf("the process holds %d MiB; it must fail closed", got/mib)
				}
				if mi := p.do("meminfo"); mi.Vals[1] != 0 {
					t.Errorf("cuMemGetInfo total %d MiB, want 0 (failing closed)", mi.Vals[1]/mib)
				}
				p.kill()
				if msg := p.stderr.String(); strings.Count(msg, tc.why) != 1 || !strings.Contains(msg, "failing closed") {
					t.Errorf("stderr does not say %q once with \"failing closed\":\n%s", tc.why, msg)
				}
				return
			}
			checkWithinCap(t, dev, true, p)
			if q, err := region.ReadQuota(f.Quota); err != nil || q.MemoryLimitBytes != capMiB*mib {
				t.Errorf("the slice's quota file changed: %+v, %v", q, err)
			}
		})
	}
}

// tamperWhileAllocating runs two processes of a slice holding 16 MiB each,
// lets the tenant (root in the container) run script, and checks that both
// fail closed within the poll interval, that a process started afterwards
// cannot use the GPU (cuInit refused), that each says why exactly once, and
// that the three never hold more than the slice.
func tamperWhileAllocating(t *testing.T, script, whyRunning, whyStarting string) {
	t.Helper()
	t.Parallel()
	dev, f := capSlice(t)
	a, b := dev.start(f, slice{}), dev.start(f, slice{})
	for _, p := range []*proc{a, b} {
		if r := p.do(fmt.Sprintf("alloc linear %d", 16*mib)); r.Res != cudaSuccess {
			t.Fatalf("alloc before the tampering: CUresult %d", r.Res)
		}
	}
	if out, err := dev.tenant(f, 0, script); err != nil {
		t.Fatalf("tenant script %q: %v\n%s", script, err, out)
	}
	for i, p := range []*proc{a, b} {
		if r := p.do(fmt.Sprintf("waitoom %d 2000", mib)); r.Res != cudaOutOfMemory || r.Vals[0] > 200000 {
			t.Errorf("process %d after the tampering: CUresult %d after %d us, want out of memory within 200 ms", i, r.Res, r.Vals[0])
		}
	}
	c := dev.startAs(f, procOpts{})
	if r := c.next(30 * time.Second); r.Cmd != "setup" || r.Res != cudaNotPermitted {
		t.Errorf("a process started after the tampering: %+v, want setup refused with CUDA_ERROR_NOT_PERMITTED (%d)", r, cudaNotPermitted)
	}
	for i, r := range fillAll(t, a, b, c) {
		if r.Res == cudaSuccess || r.Vals[0] != 0 {
			t.Errorf("process %d filled %d blocks after the tampering (CUresult %d), want none", i, r.Vals[0], r.Res)
		}
	}
	checkWithinCap(t, dev, false, a, b, c)
	if sum := held(dev, a, b, c); sum != 32*mib {
		t.Errorf("the slice's processes hold %d MiB, want the 32 MiB they held before", sum/mib)
	}
	for i, p := range []*proc{a, b, c} {
		p.kill()
		why := whyRunning
		if p == c {
			why = whyStarting
		}
		if msg := p.stderr.String(); strings.Count(msg, why) != 1 || !strings.Contains(msg, "failing closed") {
			t.Errorf("process %d's stderr does not say %q once with \"failing closed\":\n%s", i, why, msg)
		}
	}
}

const usagePath = "/var/run/gpubroker/usage/usage.bin"

// TestUsageRegionDeletedWhileAllocating: root in the container deletes the
// usage file.
func TestUsageRegionDeletedWhileAllocating(t *testing.T) {
	tamperWhileAllocating(t, "rm "+usagePath, "was deleted while in use", "does not exist")
}

// TestUsageRegionReplacedByADirectory: the usage file becomes a directory.
func TestUsageRegionReplacedByADirectory(t *testing.T) {
	tamperWhileAllocating(t, "rm "+usagePath+" && mkdir "+usagePath, "was replaced by a directory", "is a directory, not a regular file")
}

// TestUsageRegionReplacedByASymlink: the usage file becomes a symbolic link
// to a file of the right size elsewhere.
func TestUsageRegionReplacedByASymlink(t *testing.T) {
	tamperWhileAllocating(t, "cp "+usagePath+" /var/run/gpubroker/elsewhere.bin && rm "+usagePath+" && ln -s /var/run/gpubroker/elsewhere.bin "+usagePath,
		"was replaced by a symbolic link", "is a symbolic link, not a regular file")
}

// TestUsageRegionReplacedByAFIFO: the usage file becomes a FIFO, which would
// block every process that opened it.
func TestUsageRegionReplacedByAFIFO(t *testing.T) {
	tamperWhileAllocating(t, "rm "+usagePath+" && mkfifo "+usagePath, "was replaced by a FIFO", "is a FIFO, not a regular file")
}

// TestUsageRegionOverwrittenWithGarbage: random bytes over the region's
// header, in place (the file stays; anyone who can map it can do this).
func TestUsageRegionOverwrittenWithGarbage(t *testing.T) {
	tamperWhileAllocating(t, "dd if=/dev/urandom of="+usagePath+" bs=256 count=1 conv=notrunc status=none",
		"its header was overwritten", "is not a usage region")
}

// TestTenantThatIsNotRootCannotReplaceTheUsageRegion: the usage directory is
// root's and 0755, so a tenant running as another uid can neither delete,
// rename nor replace the file, nor plant anything next to it; its processes
// keep their shared accounting and the slice's cap.
func TestTenantThatIsNotRootCannotReplaceTheUsageRegion(t *testing.T) {
	t.Parallel()
	needRoot(t)
	dev, f := capSlice(t)
	a, b := dev.startAs(f, procOpts{uid: tenantUID}), dev.startAs(f, procOpts{uid: tenantUID})
	for _, p := range []*proc{a, b} {
		if r := p.do(fmt.Sprintf("alloc linear %d", 16*mib)); r.Res != cudaSuccess {
			t.Fatalf("alloc as uid %d: CUresult %d", tenantUID, r.Res)
		}
	}
	for _, script := range []string{
		"rm -f " + usagePath,
		"mv " + usagePath + " " + usagePath + ".old",
		"mkdir /var/run/gpubroker/usage/x",
		"ln -s /tmp /var/run/gpubroker/usage/x",
		"mkfifo /var/run/gpubroker/usage/x",
		"cp " + usagePath + " /tmp/u && mv -f /tmp/u " + usagePath,
		"mv /var/run/gpubroker/usage /var/run/gpubroker/usage.old",
	} {
		if out, err := dev.tenant(f, tenantUID, script); err == nil {
			t.Errorf("as uid %d, %q succeeded:\n%s", tenantUID, script, out)
		}
	}
	if st, err := os.Lstat(f.Usage); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("the usage file after the attempts: %v, %v", st, err)
	}
	for i, r := range fillAll(t, a, b) {
		if r.Res != cudaOutOfMemory {
			t.Errorf("process %d: fill ended with CUresult %d, want out of memory", i, r.Res)
		}
	}
	checkWithinCap(t, dev, true, a, b)
}

// TestDlmopenOfTheDriverIsRefused: a second link-map namespace has no hook.
// Loading the driver, NVML, a renamed copy of the driver, or a library that
// depends on the driver into one is refused, with one message each; nothing
// is allocated past the cap.
func TestDlmopenOfTheDriverIsRefused(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"libcuda.so.1", "libnvidia-ml.so.1",
		filepath.Join(buildDir(), "renamed", "libnotcuda.so"), filepath.Join(buildDir(), "testlib", "libusescuda.so")} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			dev := newDevice(t)
			dev.within(tenantTimeout)
			f := dev.newSlice("s")
			p := dev.start(f, slice{MemoryMiB: capMiB, ComputePercent: 100})
			if r := p.do(fmt.Sprintf("fill linear %d", mib)); r.Res != cudaOutOfMemory {
				t.Fatalf("fill through the hook: CUresult %d", r.Res)
			}
			// The slice is full: one more MiB through the second namespace would pass the cap.
			r := p.do(fmt.Sprintf("dlmopen %s %d", file, mib))
			if r.Vals[0] != 0 {
				t.Errorf("dlmopen(LM_ID_NEWLM, %s) loaded it (allocation CUresult %d)", file, r.Res)
			}
			checkWithinCap(t, dev, true, p)
			p.kill()
			if msg := p.stderr.String(); strings.Count(msg, "dlmopen(") != 1 || !strings.Contains(msg, "refused") {
				t.Errorf("stderr does not refuse the dlmopen once:\n%s", msg)
			}
		})
	}
}

// TestDriverLoadedByPathEndsHooked: the driver reached by dlopen of an
// absolute path, of a copy under another path, or of a copy under another
// name and soname, and every function taken from it by dlsym, goes through
// the hook: the cap holds and memory queries show the slice.
func TestDriverLoadedByPathEndsHooked(t *testing.T) {
	t.Parallel()
	copyDir := t.TempDir()
	copied := filepath.Join(copyDir, "libcuda.so.1")
	b, err := os.ReadFile(filepath.Join(buildDir(), "stub", "libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copied, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"absolute path": filepath.Join(buildDir(), "stub", "libcuda.so.1"),
		"copy":          copied,
		"renamed copy":  filepath.Join(buildDir(), "renamed", "libnotcuda.so"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dev, f := capSlice(t)
			p := dev.startAs(f, procOpts{}, "-a", path)
			if r := p.do(fmt.Sprintf("fill linear %d", mib)); r.Res != cudaOutOfMemory {
				t.Errorf("fill ended with CUresult %d, want out of memory", r.Res)
			}
			checkWithinCap(t, dev, true, p)
			if mi := p.do("meminfo"); mi.Vals[1] != capMiB*mib {
				t.Errorf("cuMemGetInfo total %d MiB, want the slice's %d", mi.Vals[1]/mib, capMiB)
			}
		})
	}
}

// TestDeepBoundLibraryCallsThroughTheHook: a library that links the driver,
// loaded with RTLD_DEEPBIND (which would bind its calls to the driver ahead
// of the preloaded hook), still allocates through the hook, and so does its
// dlsym(RTLD_NEXT) of the driver's function. dlopen through the hook keeps
// the caller's RUNPATH (the call reaches glibc with the caller's address).
func TestDeepBoundLibraryCallsThroughTheHook(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	dev.within(tenantTimeout)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: capMiB, ComputePercent: 100})
	lib := filepath.Join(buildDir(), "testlib", "libusescuda.so")
	if r := p.do(fmt.Sprintf("deepbind %s %d", lib, 2*capMiB*mib)); r.Res != cudaOutOfMemory {
		t.Errorf("twice the slice from a deep-bound library: CUresult %d, want out of memory", r.Res)
	}
	if r := p.do(fmt.Sprintf("deepbind %s %d", lib, (capMiB/2)*mib)); r.Res != cudaSuccess {
		t.Errorf("half the slice from a deep-bound library: CUresult %d, want success", r.Res)
	}
	if got := held(dev, p); got != (capMiB/2)*mib {
		t.Errorf("the driver holds %d MiB, want the %d the hook admitted", got/mib, capMiB/2)
	}
	// The same library's lookup of the driver's cuMemAlloc_v2 by dlsym(RTLD_NEXT) gets the hook.
	if r := p.do(fmt.Sprintf("nextalloc %s %d", lib, capMiB*mib)); r.Res != cudaOutOfMemory {
		t.Errorf("the whole slice again through dlsym(RTLD_NEXT): CUresult %d, want out of memory", r.Res)
	}
	if r := p.do("runpath"); r.Vals[0] != 1 {
		t.Error("dlopen through the hook lost the caller's RUNPATH")
	}
}

// TestCuGetProcAddressEveryVersionEndsHooked reaches every allocation and
// launch function through cuGetProcAddress v1 and v2, for several CUDA
// versions and both stream flavours: the cap holds. The legacy 32-bit
// cuMemAlloc, by dlsym or by an old cudaVersion, is refused.
func TestCuGetProcAddressEveryVersionEndsHooked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
	}{
		{"v2 12.0", []string{"-p", "-V", "12000"}},
		{"v2 12.4", []string{"-p", "-V", "12040"}},
		{"v2 13.0", []string{"-p", "-V", "13000"}},
		{"v2 12.4 per-thread", []string{"-P", "-V", "12040"}},
		{"v1 12.0", []string{"-1", "-V", "12000"}},
		{"v1 12.4", []string{"-1", "-V", "12040"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dev, f := capSlice(t)
			p := dev.startAs(f, procOpts{}, tc.args...)
			for _, kind := range []string{"linear", "async", "vmm"} {
				if r := p.do(fmt.Sprintf("fill %s %d", kind, 2*mib)); r.Res != cudaOutOfMemory {
					t.Errorf("fill %s: CUresult %d, want out of memory", kind, r.Res)
				}
				checkWithinCap(t, dev, true, p)
				p.do("freeall")
			}
			for _, cmd := range []string{"legacy", "legacyproc"} {
				if r := p.do(fmt.Sprintf("%s %d", cmd, 8*mib)); r.Res != cudaNotSupported {
					t.Errorf("%s cuMemAlloc: CUresult %d, want CUDA_ERROR_NOT_SUPPORTED (%d)", cmd, r.Res, cudaNotSupported)
				}
			}
			if got := held(dev, p); got != 0 {
				t.Errorf("the driver holds %d MiB after the legacy calls, want 0", got/mib)
			}
		})
	}
}

// TestQuotaWrittenAfterStartIsWaitedFor: a process whose first driver call
// comes before the node agent wrote the slice's first quota file waits for
// it (up to GPULIMIT_QUOTA_WAIT_NS) instead of failing at once.
func TestQuotaWrittenAfterStartIsWaitedFor(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	dev.within(tenantTimeout)
	f := dev.newSlice("s")
	p := dev.startAs(f, procOpts{env: []string{"GPUBROKER_LIMITER_LOG=info"}})
	waitFor := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.errText(), "waiting up to 5 s for the quota file") {
		if time.Now().After(waitFor) {
			t.Fatalf("the process never started waiting for its quota:\n%s", p.errText())
		}
		<-time.After(2 * time.Millisecond)
	}
	dev.initialQuota(f, slice{MemoryMiB: capMiB, ComputePercent: 100})
	if r := p.do(fmt.Sprintf("fill linear %d", mib)); r.Res != cudaOutOfMemory || r.Vals[0] != capMiB {
		t.Errorf("fill after the quota arrived: %+v, want the whole %d MiB", r, capMiB)
	}
	p.kill()
	if strings.Contains(p.stderr.String(), "failing closed") {
		t.Errorf("the process failed closed although the quota came in time:\n%s", p.stderr.String())
	}
}
