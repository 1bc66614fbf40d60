package hook_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/region"
)

// TestEveryLaunchFamilyIsGated: each launch entry point passes the pacer
// (its blocks are counted in the slice's bucket) and is recorded in the
// process's usage slot, directly and through cuGetProcAddress.
func TestEveryLaunchFamilyIsGated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind       string
		wantBlocks uint64 // for 10 launches of 100 blocks on a 132-SM device
	}{
		{kind: "kernel", wantBlocks: 1000},
		{kind: "ex", wantBlocks: 1000},
		{kind: "coop", wantBlocks: 1000},
		{kind: "graph", wantBlocks: 1320}, // a graph launch counts one full wave
	}
	for _, path := range []string{"direct", "cuGetProcAddress", "cuGetProcAddress per-thread"} {
		for _, tc := range tests {
			t.Run(path+"/"+tc.kind, func(t *testing.T) {
				t.Parallel()
				dev := newDevice(t)
				f := dev.newSlice("s")
				var args []string
				switch path {
				case "cuGetProcAddress":
					args = append(args, "-p")
				case "cuGetProcAddress per-thread":
					args = append(args, "-P") // the _ptsz entry points
				}
				p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 50}, args...)
				start := time.Now()
				if r := p.do(fmt.Sprintf("launch %s busy_10us 100 10", tc.kind)); r.Res != cudaSuccess {
					t.Fatalf("launch %s: CUresult %d", tc.kind, r.Res)
				}
				u, err := region.ReadUsage(f.Usage)
				if err != nil {
					t.Fatal(err)
				}
				if u.Pace.BlocksTotal != tc.wantBlocks {
					t.Errorf("pacer counted %d blocks, want %d", u.Pace.BlocksTotal, tc.wantBlocks)
				}
				if len(u.Processes) != 1 || u.Processes[0].PID != uint32(p.pid()) || u.Processes[0].LaunchCount != 10 {
					t.Fatalf("usage processes = %+v, want pid %d with 10 launches", u.Processes, p.pid())
				}
				if last := u.Processes[0].LastLaunch; last.Before(start.Add(-time.Second)) || last.After(time.Now().Add(time.Second)) {
					t.Errorf("last launch at %v, want within the command (%v..now)", last, start)
				}
				if u.Pace.SMCount != 132 {
					t.Errorf("pacer measured %d SMs, want 132", u.Pace.SMCount)
				}
			})
		}
	}
}
