package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// rulesDir holds the alert rules and their promtool test cases.
const rulesDir = "../../deploy/helm/gpubroker/rules"

// TestGuaranteeBook: throttled or continuously launching windows are
// wanted, and met when the SM share reached 90 % of the guarantee;
// unknown SM and idle windows count for neither; the ring forgets what is
// older than the window; a GPU's summary is its worst tenant.
func TestGuaranteeBook(t *testing.T) {
	g := newGuarantees(10 * time.Minute) // six windows an hour
	sm := func(n int) *int { return &n }
	tick := func(slice string, launches ...uint64) {
		for _, l := range launches {
			g.tick(slice, l)
		}
	}
	type step struct {
		ticks       []uint64 // launch counts at pace ticks before the round
		w           window
		wantW, want bool
	}
	a := func(s *int, wait time.Duration) window {
		return window{slice: "a", gpu: "G", percent: 30, sm: s, device: sm(100), wait: wait, waitKnown: true}
	}
	steps := []step{
		{w: a(sm(40), 0)}, // first reading: no wait baseline yet
		{w: a(sm(28), time.Second), wantW: true, want: true},                      // throttled, 28 >= 27
		{w: a(sm(20), 2*time.Second), wantW: true},                                // throttled, 20 < 27
		{w: a(nil, 3*time.Second)},                                                // throttled, SM unknown: neither
		{ticks: []uint64{1, 2, 3, 4, 5}, w: a(sm(5), 3*time.Second), wantW: true}, // continuous launches, starved
		{ticks: []uint64{5, 5, 6, 6, 6}, w: a(sm(5), 3*time.Second)},              // launching now and then: not wanting
	}
	for i, s := range steps {
		tick("a", s.ticks...)
		_, wanted, met := g.round(s.w)
		if wanted != s.wantW || met != s.want {
			t.Errorf("window %d: wanted %v met %v, want %v %v", i, wanted, met, s.wantW, s.want)
		}
	}
	f, _, _ := g.round(a(sm(30), 6*time.Second)) // the eighth window pushes out the first two (not wanted, met)
	if diff := cmp.Diff(v1.Guarantee{Percent: 30, WindowSeconds: 3600, WantedSeconds: 2400, MetSeconds: 1200}, f); diff != "" {
		t.Errorf("figures (-want +got):\n%s", diff)
	}
	if got, want := f.Words(), "got its 30 % guarantee 50.0 % of the time it asked for it over the last hour"; got != want {
		t.Errorf("words %q, want %q", got, want)
	}
	g.round(window{slice: "b", gpu: "G", percent: 70, sm: sm(70), wait: 0, waitKnown: true})
	g.round(window{slice: "b", gpu: "G", percent: 70, sm: sm(70), wait: time.Second, waitKnown: true})
	g.round(window{slice: "c", gpu: "H", percent: 10, sm: sm(0), waitKnown: false})
	sums := g.summaries()
	want := map[string]v1.Guarantee{"G": {Percent: 30, WindowSeconds: 3600, WantedSeconds: 2400, MetSeconds: 1200, Slice: "a", Tenants: 2}}
	if diff := cmp.Diff(want, sums); diff != "" {
		t.Errorf("summaries (-want +got):\n%s", diff)
	}
	g.forget("a")
	if s := g.summaries()["G"]; s.Slice != "b" || s.Tenants != 1 || s.Ratio() != 1 {
		t.Errorf("after forgetting a: %+v, want b alone, all met", s)
	}
}

// counter returns the value of the agent counter name for slice.
func counter(t *testing.T, reg *prometheus.Registry, name, slice string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "slice") == slice {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestGuaranteeOnStubDriver runs the agent in real time on the stub driver
// with two hooked slices on one GPU, guaranteed 30 % and 70 % (no burst),
// both saturating it. Case "contending": each gets its guarantee, and the
// agent reports it met at least 95 % of the time it asked. Case
// "overloaded": a host program outside gpubroker saturates the GPU too
// (the agent reports such programs, it does not stop them), the guarantees
// cannot hold, and the agent reports it: the worst tenant below 95 %, in
// the GPU's summary too. Both cases' measured rates then drive the alert
// rule in a promtool test case: it fires for the overloaded GPU only.
// Ratios are taken from the agent's counters over the windows after the
// hook's controllers settled (as the rule's increase() does).
func TestGuaranteeOnStubDriver(t *testing.T) {
	stubtest.Need(t)
	promtool := testdeps.Need(t, "/usr/bin/promtool")
	if testing.Short() {
		t.Skip("two 25 s measurements; skipped with -short")
	}
	const interval = time.Second                // the agent's default window
	measured := map[string]map[string]float64{} // case → slice → ratio
	for _, tc := range []struct {
		name     string
		hog      bool
		check    func(t *testing.T, ratio map[string]float64, sum v1.Guarantee)
		alerting bool
	}{
		{name: "contending", check: func(t *testing.T, ratio map[string]float64, _ v1.Guarantee) {
			for s, r := range ratio {
				if r < 0.95 {
					t.Errorf("slice %s got its guarantee %.1f %% of the time it asked, want >= 95 %%", s, 100*r)
				}
			}
		}},
		{name: "overloaded", hog: true, alerting: true, check: func(t *testing.T, ratio map[string]float64, sum v1.Guarantee) {
			worst := min(ratio["g30"], ratio["g70"])
			if worst >= 0.95 {
				t.Errorf("with a host program saturating the GPU the worst tenant still got its guarantee %.1f %% of the time, want < 95 %%", 100*worst)
			}
			if sum.Tenants != 2 || sum.Ratio() >= 0.95 {
				t.Errorf("the GPU's summary %+v, want its 2 tenants and a worst ratio below 95 %%", sum)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("GPUBROKER_STUB_STATE", filepath.Join(dir, "stub.state"))
			env := append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+filepath.Join(dir, "stub.state"), "LD_LIBRARY_PATH="+stubtest.StubDir())
			root := filepath.Join(dir, "host")
			pods := StaticPods{
				{ID: "g30", PodUID: uidA, Pod: "a", Namespace: "ns", GPU: stubtest.DeviceUUID, Sharing: v1.SharingSliced,
					Initial: v1.Slice{MemoryMiB: 1024, ComputePercent: 30, ComputeLimitPercent: 30}},
				{ID: "g70", PodUID: uidB, Pod: "b", Namespace: "ns", GPU: stubtest.DeviceUUID, Sharing: v1.SharingSliced,
					Initial: v1.Slice{MemoryMiB: 1024, ComputePercent: 70, ComputeLimitPercent: 70}},
			}
			srv := redistest.Start(t)
			store := agentstore.New(srv.Client(t), srv.Prefix(t))
			reg := prometheus.NewRegistry()
			a, err := New(Config{Node: "gpu-1", HostRoot: root, SampleInterval: interval,
				TrustUsagePIDs: true, Enforcement: Policy{Mode: ModeOff}},
				Deps{NVML: nvml.New(nvml.WithLibraryPath(filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"))),
					Samples: store, Quotas: store, Audit: store, Pods: pods, Killer: &fakeKiller{}, Metrics: reg})
			if err != nil {
				t.Fatal(err)
			}
			var progs []*stubtest.Prog
			for _, p := range pods {
				if err := a.prepareSlice(p); err != nil {
					t.Fatal(err)
				}
				sliceDir := filepath.Join(root, v1.HostSlicesSubdir, p.ID)
				progs = append(progs, stubtest.StartInSlice(t, env, filepath.Join(sliceDir, "quota"), filepath.Join(sliceDir, "usage")))
			}
			if tc.hog {
				progs = append(progs, stubtest.Start(t, env)) // the host's, no hook
			}
			for _, p := range progs {
				if res, _ := p.Do("alloc linear 1048576"); res != 0 {
					t.Fatalf("alloc: CUresult %d", res)
				}
			}
			defer runAgent(t, a)()
			// Saturate for longer than the measurement: the programs are
			// stopped at the end of the test, so no window sees one finish.
			for _, p := range progs {
				p.Send("saturate busy_100us 264 60000")
			}
			// Let the hook's controllers settle, then measure 20 windows.
			// windowsAfter waits for n more sampling windows after from, one
			// at a time, and returns the last one's time.
			windowsAfter := func(n int, from time.Time) time.Time {
				t.Helper()
				at := from
				for i := range n {
					stubtest.Eventually(t, fmt.Sprintf("sampling window %d of %d", i+1, n), func() (bool, string) {
						s, err := store.LatestSample(t.Context(), "g70")
						if err != nil || !s.At.After(at) {
							return false, fmt.Sprint(s.At, err)
						}
						at = s.At
						return true, ""
					})
				}
				return at
			}
			start := windowsAfter(3, time.Time{})
			type reading struct{ wanted, met float64 }
			read := func() map[string]reading {
				out := map[string]reading{}
				for _, p := range pods {
					out[p.ID] = reading{counter(t, reg, "gpubroker_agent_guarantee_wanted_seconds_total", p.ID),
						counter(t, reg, "gpubroker_agent_guarantee_met_seconds_total", p.ID)}
				}
				return out
			}
			before := read()
			windowsAfter(20, start)
			after := read()
			for _, p := range pods {
				ss, _ := store.RecentSamples(t.Context(), p.ID, 30)
				var sms []string
				for _, x := range ss {
					sms = append(sms, fmt.Sprint(deref(x.SMPercent)))
				}
				t.Logf("%s: slice %s SM %% per window, newest first: %s", tc.name, p.ID, strings.Join(sms, " "))
			}
			ratio := map[string]float64{}
			for id, b := range before {
				dw, dm := after[id].wanted-b.wanted, after[id].met-b.met
				if dw < 15*interval.Seconds() {
					t.Errorf("slice %s asked for its guarantee %.1f s of the 20 windows, want >= 15: saturating, it has work waiting", id, dw)
					continue
				}
				ratio[id] = dm / dw
				t.Logf("%s: slice %s asked %.1f s, got its guarantee %.1f s: %.1f %%", tc.name, id, dw, dm, 100*ratio[id])
			}
			sum := a.nodeReport().GPUs[0].Guarantee
			if sum == nil {
				t.Fatal("the node report has no guarantee summary for the GPU")
			}
			tc.check(t, ratio, *sum)
			s, err := store.LatestSample(t.Context(), "g30")
			if err != nil || s.Guarantee == nil || s.Guarantee.Percent != 30 || s.Guarantee.WindowSeconds != 3600 {
				t.Errorf("g30's sample guarantee %+v (%v), want its 30 %% over the hour", s.Guarantee, err)
			}
			measured[tc.name] = ratio
		})
	}
	if t.Failed() {
		return
	}
	// The measured rates, as Prometheus would see the counters over 40
	// minutes of such load, drive the alert rule.
	rules, err := filepath.Abs(filepath.Join(rulesDir, "gpubroker.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var series, alerts strings.Builder
	for _, name := range []string{"contending", "overloaded"} {
		gpu := "GPU-" + name
		for id, r := range measured[name] {
			fmt.Fprintf(&series, "      - series: 'gpubroker_agent_guarantee_wanted_seconds_total{slice=%q,gpu=%q}'\n        values: '0+60x40'\n", id, gpu)
			fmt.Fprintf(&series, "      - series: 'gpubroker_agent_guarantee_met_seconds_total{slice=%q,gpu=%q}'\n        values: '0+%.3fx40'\n", id, gpu, 60*r)
		}
	}
	// Firing after 30 minutes: the overloaded GPU, and only it.
	fmt.Fprintf(&alerts, "          - labels: 'ALERTS{alertname=\"GpubrokerGuaranteesNotMet\",alertstate=\"firing\",gpu=\"GPU-overloaded\",severity=\"warning\"}'\n            value: 1\n")
	test := fmt.Sprintf(`rule_files: [%q]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
%s    promql_expr_test:
      - expr: ALERTS{alertname="GpubrokerGuaranteesNotMet",alertstate="firing"}
        eval_time: 30m
        exp_samples:
%s`, rules, series.String(), alerts.String())
	path := filepath.Join(t.TempDir(), "measured.test.yaml")
	if err := os.WriteFile(path, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules with the measured rates: %v\n%s\n%s", err, out, test)
	}
}

// TestGuaranteeAlertRule checks the rule file and runs its promtool test
// cases.
func TestGuaranteeAlertRule(t *testing.T) {
	promtool := testdeps.Need(t, "/usr/bin/promtool")
	for _, args := range [][]string{
		{"check", "rules", filepath.Join(rulesDir, "gpubroker.rules.yaml")},
		{"test", "rules", filepath.Join(rulesDir, "guarantee.rules.test.yaml")},
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
