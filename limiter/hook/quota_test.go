package hook_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/region"
)

const applyWithin = 100 * time.Millisecond

func writeQuota(t *testing.T, path string, memMiB uint64) {
	t.Helper()
	if err := region.WriteQuota(path, region.Quota{SliceID: "test-slice", MemoryLimitBytes: memMiB * mib, ComputePercent: 100, ComputeLimitPercent: 100}); err != nil {
		t.Fatal(err)
	}
}

// waitFor sends a waitalloc/waitoom command right after the quota changed and
// returns how long the running process took to see the change.
func waitFor(t *testing.T, p *proc, command string, bytes uint64, wantRes int) time.Duration {
	t.Helper()
	r := p.do(fmt.Sprintf("%s %d 2000", command, bytes))
	if r.Res != wantRes {
		t.Fatalf("%s %d: CUresult %d after %dus, want %d", command, bytes, r.Res, r.Vals[0], wantRes)
	}
	d := time.Duration(r.Vals[0]) * time.Microsecond
	t.Logf("%s %d MiB: the change applied after %v", command, bytes/mib, d)
	return d
}

// TestQuotaChangeAppliesLiveBothWays raises and lowers a running process's
// limit through the quota file: each change applies within 100 ms, and a
// shrink below current use refuses new allocations without freeing anything.
func TestQuotaChangeAppliesLiveBothWays(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 100})
	if r := p.do(fmt.Sprintf("alloc linear %d", 128*mib)); r.Res != cudaOutOfMemory {
		t.Fatalf("128 MiB under the initial 64 MiB quota: CUresult %d, want OOM", r.Res)
	}

	writeQuota(t, f.Quota, 256) // generation 2 beats the initial 1
	if d := waitFor(t, p, "waitalloc", 128*mib, cudaSuccess); d > applyWithin {
		t.Errorf("raise took %v to apply, want <= %v", d, applyWithin)
	}

	if r := p.do(fmt.Sprintf("alloc linear %d", 48*mib)); r.Res != cudaSuccess {
		t.Fatalf("hold 48 MiB: CUresult %d", r.Res)
	}
	writeQuota(t, f.Quota, 32) // below the 48 MiB in use
	if d := waitFor(t, p, "waitoom", mib, cudaOutOfMemory); d > applyWithin {
		t.Errorf("shrink took %v to apply, want <= %v", d, applyWithin)
	}
	if held := dev.stub().procMem(p.pid()); held != 48*mib {
		t.Errorf("after the shrink the driver holds %d bytes, want the 48 MiB the program kept", held)
	}
	if mi := p.do("meminfo"); mi.Vals[0] != 0 || mi.Vals[1] != 32*mib {
		t.Errorf("cuMemGetInfo after shrink = %v, want free 0 total %d", mi.Vals, 32*mib)
	}
	if r := p.do("free"); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	if r := p.do(fmt.Sprintf("alloc linear %d", 16*mib)); r.Res != cudaSuccess {
		t.Errorf("after use dropped below the new limit: CUresult %d, want success", r.Res)
	}
}

// TestQuotaFileOlderGenerationIgnored: a file whose generation is not higher
// than the one in force changes nothing.
func TestQuotaFileOlderGenerationIgnored(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	if err := region.WriteQuota(f.Quota, region.Quota{Generation: 5, SliceID: "test-slice", MemoryLimitBytes: 64 * mib, ComputePercent: 100, ComputeLimitPercent: 100}); err != nil {
		t.Fatal(err)
	}
	p := dev.start(f, slice{MemoryMiB: 8, ComputePercent: 100})
	if r := p.do(fmt.Sprintf("alloc linear %d", 32*mib)); r.Res != cudaSuccess {
		t.Fatalf("the quota file's generation 5 (64 MiB) is in force: CUresult %d", r.Res)
	}
	// Replace the file by hand with generation 3 and a tiny limit: ignored.
	b, err := region.EncodeQuota(region.Quota{Generation: 3, SliceID: "test-slice", MemoryLimitBytes: mib, ComputePercent: 100, ComputeLimitPercent: 100})
	if err != nil {
		t.Fatal(err)
	}
	tmp := f.Quota + ".new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.Quota); err != nil {
		t.Fatal(err)
	}
	if r := p.do(fmt.Sprintf("waitoom %d 300", 16*mib)); r.Res != cudaSuccess {
		t.Errorf("an older generation took effect: alloc of 16 MiB refused after %dus", r.Vals[0])
	}
}

// TestInvalidQuotaFileFailsClosed: a quota file that exists but is invalid
// refuses new allocations within 100 ms with a message on stderr, frees keep
// working, and the next valid file lifts the refusal.
func TestInvalidQuotaFileFailsClosed(t *testing.T) {
	t.Parallel()
	valid := func(t *testing.T, sliceID string) []byte {
		b, err := region.EncodeQuota(region.Quota{Generation: 7, SliceID: sliceID, MemoryLimitBytes: 64 * mib, ComputePercent: 100, ComputeLimitPercent: 100})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name    string
		content func(t *testing.T) []byte
		why     string // expected in the stderr message
	}{
		{name: "not a quota region", content: func(*testing.T) []byte { return []byte("this is not a quota region") }, why: "has 26 bytes, not 128"},
		{name: "empty file", content: func(*testing.T) []byte { return nil }, why: "has 0 bytes, not 128"},
		{name: "flipped bit", content: func(t *testing.T) []byte { b := valid(t, "test-slice"); b[81] ^= 0x40; return b }, why: "checksum mismatch"},
		{name: "future layout", content: func(t *testing.T) []byte { b := valid(t, "test-slice"); b[4] = 9; return b }, why: "unknown layout version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dev := newDevice(t)
			f := dev.newSlice("s")
			p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 100})
			if r := p.do(fmt.Sprintf("alloc linear %d", mib)); r.Res != cudaSuccess {
				t.Fatal(r)
			}
			tmp := f.Quota + ".new"
			if err := os.WriteFile(tmp, tc.content(t), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, f.Quota); err != nil {
				t.Fatal(err)
			}
			if d := waitFor(t, p, "waitoom", mib, cudaOutOfMemory); d > applyWithin {
				t.Errorf("invalid file took %v to close, want <= %v", d, applyWithin)
			}
			if r := p.do("free"); r.Res != cudaSuccess {
				t.Errorf("frees must keep working when failing closed: CUresult %d", r.Res)
			}
			if err := region.WriteQuota(f.Quota, region.Quota{Generation: 8, SliceID: "test-slice", MemoryLimitBytes: 64 * mib, ComputePercent: 100, ComputeLimitPercent: 100}); err != nil {
				t.Fatal(err)
			}
			if d := waitFor(t, p, "waitalloc", mib, cudaSuccess); d > applyWithin {
				t.Errorf("valid file took %v to reopen, want <= %v", d, applyWithin)
			}
			p.kill()
			if msg := p.stderr.String(); !strings.Contains(msg, tc.why) || !strings.Contains(msg, "failing closed") {
				t.Errorf("stderr does not say %q and \"failing closed\":\n%s", tc.why, msg)
			}
		})
	}
}
