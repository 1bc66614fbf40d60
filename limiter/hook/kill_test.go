package hook_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/region"
)

// TestSIGKILLDuringAllocationLoop kills, 100 times, a process of the slice in
// the middle of an allocation loop while another process of the same slice
// keeps allocating. Nothing hangs, and once the killed process is reaped its
// bytes no longer count: the survivor can take the whole slice.
func TestSIGKILLDuringAllocationLoop(t *testing.T) {
	t.Parallel()
	const (
		limitMiB   = 32
		iterations = 100
	)
	dev := newDevice(t)
	f := dev.newSlice("s")
	s := slice{MemoryMiB: limitMiB, ComputePercent: 100}
	survivor := dev.start(f, s)
	heldAtKill := 0
	for i := range iterations {
		victim := dev.start(f, s, "loop", fmt.Sprint(mib))
		if r := victim.next(10 * time.Second); r.Cmd != "looping" {
			t.Fatalf("iteration %d: victim said %+v", i, r)
		}
		// Allocate next to the victim; refusals are expected while it holds memory.
		if r := survivor.do(fmt.Sprintf("churn %d %d", 20+i%7, mib)); r.Res != cudaSuccess {
			t.Fatalf("iteration %d: churn: %+v", i, r)
		}
		if dev.stub().procMem(victim.pid()) > 0 {
			heldAtKill++
		}
		victim.kill() // SIGKILL, then wait: the process is reaped when this returns
		// The victim's bytes must stop counting at once; allow only the
		// survivor's own retries, bounded, so a hang or a leak fails.
		deadline := time.Now().Add(5 * time.Second)
		for {
			fill := survivor.do(fmt.Sprintf("fill linear %d", mib))
			if fill.Vals[0] == limitMiB {
				break
			}
			if time.Now().After(deadline) {
				u, _ := region.ReadUsage(f.Usage)
				t.Fatalf("iteration %d: after the victim was reaped the survivor got only %d of %d MiB; usage %+v",
					i, fill.Vals[0], limitMiB, u)
			}
			survivor.do("freeall")
		}
		if r := survivor.do("freeall"); r.Res != cudaSuccess {
			t.Fatalf("iteration %d: freeall: %+v", i, r)
		}
	}
	if heldAtKill < iterations/2 {
		t.Errorf("the victim held device memory at only %d of %d kills: the test did not kill it mid-loop", heldAtKill, iterations)
	}
	u, err := region.ReadUsage(f.Usage)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Processes) > 2 {
		t.Errorf("usage region keeps %d slots after 100 kills, want the survivor's only (plus at most one not yet freed)", len(u.Processes))
	}
}
