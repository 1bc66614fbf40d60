package hook_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/region"
)

// TestComputeShareTracksTarget runs slices that launch back to back
// (saturating) and measures each slice's share of the device's SM time from
// the stub's counters over 10 s, after every process has launched and 1 s
// of warm-up, over the time each was asking (askingShare: a launcher
// descheduled on a loaded machine asks for nothing meanwhile). Every case has its own simulated device and runs in parallel
// with the others. The processes saturate until the test ends and the
// window is timed by the stub's clock, so a test goroutine that is late on
// a loaded machine only moves or lengthens the window.
func TestComputeShareTracksTarget(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("10 s measurement; skipped with -short")
	}
	const (
		warmup    = time.Second
		window    = 10 * time.Second
		tolerance = 5.0 // percentage points
	)
	type member struct {
		guarantee, limit int
		want             float64 // expected share, percent; < 0 = not checked
	}
	tests := []struct {
		name    string
		members []member
		// hidden makes the stub's NVML report other pids than the processes'
		// own, as inside a pid namespace; a fake agent then publishes the
		// slices' utilization into their usage regions.
		hidden bool
	}{
		{name: "25 alone", members: []member{{25, 25, 25}}},
		{name: "50 alone", members: []member{{50, 50, 50}}},
		{name: "75 alone", members: []member{{75, 75, 75}}},
		{name: "25 next to a bursting 75", members: []member{{25, 25, 25}, {75, 100, 75}}},
		{name: "50 next to a bursting 50", members: []member{{50, 50, 50}, {50, 100, 50}}},
		{name: "75 next to a bursting 25", members: []member{{75, 75, 75}, {25, 100, 25}}},
		{name: "30/70 pair", members: []member{{30, 30, 30}, {70, 70, 70}}},
		// Work-conserving compute: guarantees 30/70, each may burst
		// to 100. Alone each takes ≥ 90 % (95 ± 5, as a share cannot pass
		// 100); together each gets its guarantee.
		{name: "30 with limit 100 alone", members: []member{{30, 100, 95}}},
		{name: "70 with limit 100 alone", members: []member{{70, 100, 95}}},
		{name: "30/70 pair, both bursting to 100", members: []member{{30, 100, 30}, {70, 100, 70}}},
		{name: "25 bursts to its 75 limit on an idle card", members: []member{{25, 75, 75}}},
		{name: "25 in a pid namespace, steered by the agent's samples", members: []member{{25, 25, 25}}, hidden: true},
	}
	// All cases run at once, each on its own simulated device, so the suite
	// spends one window, not one per case. The processes saturate until they
	// are killed at cleanup: a fixed run time ended before the window on a
	// loaded machine, where starting a dozen processes can take longer.
	const ms = 10 * 60 * 1000
	devs := make([]*device, len(tests))
	procs := make([][]*proc, len(tests))
	ctx, cancel := context.WithCancel(t.Context())
	var agents sync.WaitGroup
	defer agents.Wait()
	defer cancel()
	for c, tc := range tests {
		var extra []string
		if tc.hidden {
			extra = append(extra, "GPUBROKER_STUB_NVML_PID_OFFSET=1000000")
		}
		devs[c] = newDevice(t, extra...)
		var files []sliceFiles
		for i, m := range tc.members {
			f := devs[c].newSlice(fmt.Sprintf("case%d-slice%d", c, i))
			files = append(files, f)
			procs[c] = append(procs[c], devs[c].start(f, slice{MemoryMiB: 64, ComputePercent: m.guarantee, ComputeLimitPercent: m.limit},
				"saturate", "busy_200us", "132", fmt.Sprint(ms)))
		}
		if tc.hidden {
			agents.Go(func() { fakeAgent(ctx, t, devs[c], procs[c], files) })
		}
	}
	for c := range tests {
		waitLaunching(t, devs[c], procs[c]...)
	}
	time.Sleep(warmup) // the processes run on their own; sleeping only places the window
	before := make([]stubState, len(tests))
	for c := range tests {
		before[c] = devs[c].stub()
	}
	time.Sleep(window)
	for c, tc := range tests {
		a, b := before[c], devs[c].stub()
		t.Run(tc.name, func(t *testing.T) {
			for i, m := range tc.members {
				pid := procs[c][i].pid()
				got := askingShare(a, b, pid)
				t.Logf("slice %d (guarantee %d%%, limit %d%%): %.1f%% of the device over the %.1f s of %.1f s it was asking", i, m.guarantee, m.limit, got,
					float64(b.NowNs-a.NowNs-(b.procStallNs(pid)-a.procStallNs(pid)))/1e9, float64(b.NowNs-a.NowNs)/1e9)
				if m.want >= 0 && math.Abs(got-m.want) > tolerance {
					t.Errorf("slice %d (guarantee %d%%, limit %d%%) got %.1f%% of the SMs, want %.0f ± %.0f",
						i, m.guarantee, m.limit, got, m.want, tolerance)
				}
			}
		})
	}
}

// waitLaunching waits until the stub has charged SM time to every process
// in ps, failing the test after 30 s.
func waitLaunching(t *testing.T, dev *device, ps ...*proc) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := dev.stub()
		waiting := ""
		for _, p := range ps {
			if s.procSMNs(p.pid()) == 0 {
				waiting += fmt.Sprintf(" %d (stderr %q)", p.pid(), p.errText())
			}
		}
		if waiting == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes not launching within 30 s:%s", waiting)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// fakeAgent plays the node agent for a device whose NVML pids do not match
// the processes' own: every 50 ms it measures each process's SM use from the
// stub's counters and publishes it into the process's usage region, until
// ctx ends.
func fakeAgent(ctx context.Context, t *testing.T, dev *device, procs []*proc, files []sliceFiles) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	prev, err := dev.readStub()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err != nil {
			t.Errorf("agent: %v", err)
			return
		}
		cur, err2 := dev.readStub()
		if err2 != nil {
			err = err2
			continue
		}
		span := float64(cur.NowNs-prev.NowNs) * float64(cur.SMCount)
		devicePm := uint32(float64(cur.SMNsTotal-prev.SMNsTotal) / span * 1000)
		for i, p := range procs {
			slicePm := uint32(float64(cur.procSMNs(p.pid())-prev.procSMNs(p.pid())) / span * 1000)
			s := region.AgentSample{Time: time.Now(), SliceUtilPermille: slicePm, DeviceUtilPermille: devicePm}
			if werr := region.WriteAgentSample(files[i].Usage, s); werr != nil && !errors.Is(werr, fs.ErrNotExist) {
				t.Errorf("agent: %v", werr)
				return
			}
		}
		prev = cur
	}
}

// TestComputeQuotaChangeAppliesLive moves a running, saturating slice from
// 25 % to 75 % and back through its quota file; each share is measured over
// 2 s starting 1 s after the change, over the time the slice was asking.
func TestComputeQuotaChangeAppliesLive(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("8 s measurement; skipped with -short")
	}
	dev := newDevice(t)
	f := dev.newSlice("s")
	// Saturating until killed at cleanup, however long the steps take.
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 25}, "saturate", "busy_200us", "132", fmt.Sprint(10*60*1000))
	waitLaunching(t, dev, p)
	share := func() float64 {
		a := dev.stub()
		time.Sleep(2 * time.Second) // the window; the process runs on its own
		b := dev.stub()
		return askingShare(a, b, p.pid())
	}
	steps := []struct {
		percent int
		want    float64
	}{{0, 25}, {75, 75}, {25, 25}} // 0: keep the env's 25 %
	for _, s := range steps {
		if s.percent != 0 {
			q := region.Quota{SliceID: "test-slice", MemoryLimitBytes: 64 * mib, ComputePercent: uint32(s.percent), ComputeLimitPercent: uint32(s.percent)}
			if err := region.WriteQuota(f.Quota, q); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second) // settle after the change
		if got := share(); math.Abs(got-s.want) > 5 {
			t.Errorf("after setting %d%%: share %.1f%%, want %.0f ± 5", s.percent, got, s.want)
		} else {
			t.Logf("target %.0f%%: share %.1f%%", s.want, got)
		}
	}
}

// TestComputeStalledLauncherDoesNotBurst stops a saturating 25 % slice's
// process (SIGSTOP) for 150 ms in every 450 ms, as a loaded CPU or a
// debugger would, and measures its share of the device over the time it
// was asking (the stub counts the stops as stalls). Stopped, it launches
// nothing and its measured share is low; a pacer that raised its rate for
// that would let it burst past its share after every stop.
func TestComputeStalledLauncherDoesNotBurst(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("6 s measurement; skipped with -short")
	}
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 25}, "saturate", "busy_200us", "132", fmt.Sprint(10*60*1000))
	waitLaunching(t, dev, p)
	time.Sleep(time.Second) // warm-up; the process runs on its own
	a := dev.stub()
	for range 14 {
		time.Sleep(300 * time.Millisecond) // running
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond) // stopped
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	b := dev.stub()
	got := askingShare(a, b, p.pid())
	stalled := time.Duration(b.procStallNs(p.pid()) - a.procStallNs(p.pid()))
	t.Logf("share over the time it was asking (%.1f s stalled of %.1f s): %.1f%%", stalled.Seconds(), float64(b.NowNs-a.NowNs)/1e9, got)
	if stalled < 14*100*time.Millisecond {
		t.Errorf("the stub counted %v of stalls, want at least 14 × 100 ms for 14 stops of 150 ms", stalled)
	}
	if math.Abs(got-25) > 5 {
		t.Errorf("a 25%% slice stopped 150 ms in every 450 ms got %.1f%% of the SMs over the time it was asking, want 25 ± 5", got)
	}
}
