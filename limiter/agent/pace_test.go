package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// initUsage creates a usage region as the agent's prepareSlice does.
func initUsage(t testing.TB, path string) {
	t.Helper()
	if err := region.CreateUsage(path); err != nil {
		t.Fatal(err)
	}
	if u, err := region.ReadUsage(path); err != nil || len(u.Processes) != 0 {
		t.Fatalf("initialized usage region reads as %+v, %v", u, err)
	}
}

// TestPaceRoundPublishesSliceAndDeviceUse checks the pace feed on the
// dgxh200 mock: per slice the sum of its processes' SM use, per device the
// sum of all, held while NVML has no newer sample, and dropped after
// paceHoldTicks rounds without one.
func TestPaceRoundPublishesSliceAndDeviceUse(t *testing.T) {
	e := newEnv(t)
	usage := func(id string) string {
		return filepath.Join(e.root, v1.HostSlicesSubdir, id, "usage", v1.UsageFileName)
	}
	for _, id := range []string{"slice-a", "slice-b"} { // slice-c's pod has no hook yet
		if err := os.MkdirAll(filepath.Dir(usage(id)), 0o755); err != nil {
			t.Fatal(err)
		}
		initUsage(t, usage(id))
	}
	wall := t0.Add(time.Hour)
	a := e.agent(t, Config{}, nil)
	a.wall = func() time.Time { return wall }
	a.SampleOnce(t.Context()) // learns which pid is whose

	// Pace rounds see their own, newer samples: 100 at 60 %, 200 at 20 %.
	ts := uint64(100)
	fresh := true
	e.dev(0).GetProcessUtilizationFunc = func(last uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		if !fresh || ts <= last {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return []nvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: ts, SmUtil: 60}, {Pid: 200, TimeStamp: ts, SmUtil: 20}}, nvml.SUCCESS
	}
	read := func(id string) region.AgentSample {
		t.Helper()
		u, err := region.ReadUsage(usage(id))
		if err != nil {
			t.Fatal(err)
		}
		return u.Agent
	}
	a.paceRound(t.Context())
	want := map[string]region.AgentSample{
		"slice-a": {Time: wall, SliceUtilPermille: 600, DeviceUtilPermille: 800},
		"slice-b": {Time: wall, SliceUtilPermille: 200, DeviceUtilPermille: 800},
	}
	got := map[string]region.AgentSample{"slice-a": read("slice-a"), "slice-b": read("slice-b")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("first round (-want +got):\n%s", diff)
	}

	// No newer samples: the last values are held ...
	fresh = false
	for i := range paceHoldTicks {
		wall = wall.Add(100 * time.Millisecond)
		a.paceRound(t.Context())
		if s := read("slice-a"); s.SliceUtilPermille != 600 || !s.Time.Equal(wall) {
			t.Fatalf("held round %d: %+v, want 600 ‰ stamped %s", i+1, s, wall)
		}
	}
	// ... and then dropped.
	wall = wall.Add(100 * time.Millisecond)
	a.paceRound(t.Context())
	if s := read("slice-a"); s.SliceUtilPermille != 0 || s.DeviceUtilPermille != 0 {
		t.Errorf("after the hold: %+v, want 0 ‰", s)
	}
}

func TestPaceRoundSkipsADeviceWithoutUtilization(t *testing.T) {
	e := newEnv(t)
	usage := filepath.Join(e.root, v1.HostSlicesSubdir, "slice-c", "usage", v1.UsageFileName)
	if err := os.MkdirAll(filepath.Dir(usage), 0o755); err != nil {
		t.Fatal(err)
	}
	initUsage(t, usage)
	a := e.agent(t, Config{}, nil)
	a.SampleOnce(t.Context())
	e.dev(1).GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	a.paceRound(t.Context())
	u, err := region.ReadUsage(usage)
	if err != nil {
		t.Fatal(err)
	}
	if u.Agent != (region.AgentSample{}) {
		t.Errorf("agent sample %+v written without a measurement; want none (missing, never zero)", u.Agent)
	}
}
