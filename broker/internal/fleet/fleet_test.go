package fleet

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func TestGPUValidate(t *testing.T) {
	ok := GPU{UUID: "GPU-1", Node: "n1", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true}
	tests := []struct {
		name   string
		modify func(*GPU)
		want   string // "" = valid
	}{
		{"valid", func(*GPU) {}, ""},
		{"model may be empty", func(g *GPU) { g.Model = "" }, ""},
		{"unhealthy is still valid", func(g *GPU) { g.Healthy = false }, ""},
		{"blank uuid", func(g *GPU) { g.UUID = " " }, "gpu uuid is empty"},
		{"empty node", func(g *GPU) { g.Node = "" }, "gpu node is empty"},
		{"zero memory", func(g *GPU) { g.MemoryMiB = 0 }, "gpu memoryMiB must be > 0, got 0"},
		{"negative SMs", func(g *GPU) { g.SMCount = -1 }, "gpu smCount must be > 0, got -1"},
		{"every problem at once", func(g *GPU) { *g = GPU{} },
			"gpu uuid is empty\ngpu node is empty\ngpu memoryMiB must be > 0, got 0\ngpu smCount must be > 0, got 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := ok
			tc.modify(&g)
			if diff := cmp.Diff(tc.want, errText(g.Validate())); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidateSlice(t *testing.T) {
	tests := []struct {
		name  string
		slice Slice
		want  string
	}{
		{"valid", Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}, ""},
		{"full GPU", Slice{MemoryMiB: 1, ComputePercent: 100, ComputeLimitPercent: 100}, ""},
		{"zero memory", Slice{MemoryMiB: 0, ComputePercent: 20, ComputeLimitPercent: 20}, "slice memoryMiB must be > 0, got 0"},
		{"compute 0", Slice{MemoryMiB: 1, ComputePercent: 0, ComputeLimitPercent: 0},
			"slice computePercent must be 1..100, got 0\nslice computeLimitPercent must be 1..100, got 0"},
		{"compute 101 is one problem", Slice{MemoryMiB: 1, ComputePercent: 101, ComputeLimitPercent: 100},
			"slice computePercent must be 1..100, got 101"},
		{"compute 101 with limit 101 is two", Slice{MemoryMiB: 1, ComputePercent: 101, ComputeLimitPercent: 101},
			"slice computePercent must be 1..100, got 101\nslice computeLimitPercent must be 1..100, got 101"},
		{"limit below guarantee", Slice{MemoryMiB: 1, ComputePercent: 30, ComputeLimitPercent: 20},
			"slice computeLimitPercent must be at least computePercent (30), got 20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, errText(ValidateSlice(tc.slice))); diff != "" {
				t.Errorf("ValidateSlice (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPolicyValid(t *testing.T) {
	for p, want := range map[Policy]bool{PolicyBinpack: true, PolicySpread: true, "": false, "Binpack": false, "random": false} {
		if got := p.Valid(); got != want {
			t.Errorf("Policy(%q).Valid() = %v, want %v", p, got, want)
		}
	}
}

func TestQuotasForUser(t *testing.T) {
	q := Quotas{
		DefaultUser: Quota{Servers: 1},
		Users:       map[string]Quota{"alice": {Servers: 3, MemoryMiB: 65536}},
		Groups:      map[string]Quota{"ml": {ComputePercent: 200}, "ops": {Servers: 10}},
	}
	tests := []struct {
		name       string
		user       string
		groups     []string
		wantUser   Quota
		wantGroups map[string]Quota
	}{
		{"own entry replaces the default", "alice", nil, Quota{Servers: 3, MemoryMiB: 65536}, map[string]Quota{}},
		{"default for others", "bob", nil, Quota{Servers: 1}, map[string]Quota{}},
		{"only groups with a cap", "bob", []string{"ml", "nobody", "ops"}, Quota{Servers: 1},
			map[string]Quota{"ml": {ComputePercent: 200}, "ops": {Servers: 10}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, g := q.ForUser(tc.user, tc.groups)
			if diff := cmp.Diff(tc.wantUser, u); diff != "" {
				t.Errorf("user quota (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantGroups, g); diff != "" {
				t.Errorf("group quotas (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSortedGroups(t *testing.T) {
	got := SortedGroups(map[string]Quota{"zeta": {}, "alpha": {}, "mu": {}})
	if diff := cmp.Diff([]string{"alpha", "mu", "zeta"}, got); diff != "" {
		t.Errorf("SortedGroups (-want +got):\n%s", diff)
	}
	if got := SortedGroups(nil); len(got) != 0 {
		t.Errorf("SortedGroups(nil) = %v, want empty", got)
	}
}

func TestCapacityErrorMessages(t *testing.T) {
	want := Slice{MemoryMiB: 8192, ComputePercent: 30, ComputeLimitPercent: 30}
	tests := []struct {
		name string
		err  *CapacityError
		want string
	}{
		{"memory", &CapacityError{Want: want, Candidates: 4, LargestFreeMiB: 6144, LargestFreeComputePercent: 80, LargestNode: "gpu-3"},
			"no GPU has 8192 MiB free; the largest free block is 6144 MiB on node gpu-3"},
		{"compute", &CapacityError{Want: want, Candidates: 1, LargestFreeMiB: 10000, LargestFreeComputePercent: 20, LargestNode: "gpu-1"},
			"no GPU has both 8192 MiB and 30% compute free; the GPU with the most free memory (10000 MiB on node gpu-1) has 20% compute free"},
		{"no GPU", &CapacityError{Want: want}, "no healthy GPU is registered"},
		{"no GPU of a model", &CapacityError{Want: want, Model: "NVIDIA H200"}, `no healthy GPU of model "NVIDIA H200" is registered`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			var err error = tc.err
			if !errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrQuotaExceeded) {
				t.Error("a CapacityError must match ErrNoCapacity and only it")
			}
			if got := Message(errors.Join(errors.New("context"), err)); got != tc.want {
				t.Errorf("Message = %q, want the typed error's text", got)
			}
		})
	}
}

func TestQuotaErrorMessages(t *testing.T) {
	tests := []struct {
		err  *QuotaError
		want string
	}{
		{&QuotaError{Scope: "user", Name: "alice", Resource: "servers", Limit: 2, Used: 2, Want: 1},
			"user alice quota exceeded: it allows 2 servers at once, and 2 are in use"},
		{&QuotaError{Scope: "group", Name: "ml", Resource: "memoryMiB", Limit: 16384, Used: 8192, Want: 16384},
			"group ml quota exceeded: it allows 16384 MiB of slice memory; 8192 MiB are in use and this needs 16384 MiB more"},
		{&QuotaError{Scope: "user", Name: "bob", Resource: "computePercent", Limit: 50, Used: 40, Want: 20},
			"user bob quota exceeded: it allows 50 % compute; 40 % are in use and this needs 20 % more"},
	}
	for _, tc := range tests {
		t.Run(tc.err.Resource, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			var err error = tc.err
			if !errors.Is(err, ErrQuotaExceeded) || errors.Is(err, ErrNoCapacity) {
				t.Error("a QuotaError must match ErrQuotaExceeded and only it")
			}
		})
	}
}

func TestMessageStripsSentinelPrefixes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"sentinel first", fmt.Errorf("%w: server %q is already running", ErrConflict, "nb"), `server "nb" is already running`},
		{"wrapped again", fmt.Errorf("create: %w", fmt.Errorf("%w: no such profile", ErrInvalid)), "create: no such profile"},
		{"not ready", fmt.Errorf("%w: try again", ErrNotReady), "try again"},
		{"plain error", errors.New("redis: connection refused"), "redis: connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Message(tc.err); got != tc.want {
				t.Errorf("Message = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLifecycleTable(t *testing.T) {
	all := []State{v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting,
		v1.StateRunning, v1.StateStopping, v1.StateStopped, v1.StateFailed}
	// allowed lists every permitted move, from the lifecycle in ARCHITECTURE.md:
	// the happy path, stop from any live state, failed before running (a
	// failed spawn stays failed until the next start).
	allowed := map[[2]State]bool{
		{v1.StatePending, v1.StatePlacing}: true, {v1.StatePlacing, v1.StateCreating}: true,
		{v1.StateCreating, v1.StateStarting}: true, {v1.StateStarting, v1.StateRunning}: true,
		{v1.StateRunning, v1.StateStopping}: true, {v1.StateStopping, v1.StateStopped}: true,
		{v1.StateRunning, v1.StateStopped}:  true,
		{v1.StatePending, v1.StateStopping}: true, {v1.StatePlacing, v1.StateStopping}: true,
		{v1.StateCreating, v1.StateStopping}: true, {v1.StateStarting, v1.StateStopping}: true,
		{v1.StatePending, v1.StateFailed}: true, {v1.StatePlacing, v1.StateFailed}: true,
		{v1.StateCreating, v1.StateFailed}: true, {v1.StateStarting, v1.StateFailed}: true,
	}
	for _, from := range all {
		for _, to := range all {
			want := allowed[[2]State{from, to}]
			if got := slices.Contains(TransitionSources(to), from); got != want {
				t.Errorf("%s in TransitionSources(%s) = %v, want %v", from, to, got, want)
			}
		}
	}
	for _, to := range all {
		var want []State
		for _, from := range all {
			if allowed[[2]State{from, to}] {
				want = append(want, from)
			}
		}
		got := append([]State(nil), TransitionSources(to)...)
		if diff := cmp.Diff(want, sortedStates(got, all)); diff != "" {
			t.Errorf("TransitionSources(%s) (-want +got):\n%s", to, diff)
		}
	}
	if TransitionSources(v1.StatePending) != nil {
		t.Error("pending must be reachable from no state (it only starts a spawn)")
	}
	for _, s := range all {
		if want := s == v1.StateStopped || s == v1.StateFailed; Terminal(s) != want {
			t.Errorf("Terminal(%s) = %v, want %v", s, !want, want)
		}
	}
}

func TestProfileAllows(t *testing.T) {
	tests := []struct {
		name    string
		profile []string
		groups  []string
		want    bool
	}{
		{"no groups: everyone", nil, nil, true},
		{"member", []string{"ml", "ops"}, []string{"dev", "ops"}, true},
		{"not a member", []string{"ml"}, []string{"dev"}, false},
		{"no groups of the caller", []string{"ml"}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Profile{Groups: tc.profile}).Allows(tc.groups); got != tc.want {
				t.Errorf("Allows = %v, want %v", got, tc.want)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sortedStates orders states as in order, for comparing sets.
func sortedStates(states, order []State) []State {
	var out []State
	for _, o := range order {
		for _, s := range states {
			if s == o {
				out = append(out, s)
			}
		}
	}
	return out
}
