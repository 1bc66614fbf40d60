package catalog_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

const valid = `
profiles:
  - name: small
    displayName: Small
    description: a small one
    image: quay.io/jupyter/minimal-notebook:latest
    cpu: "1"
    memory: 4Gi
    slice: {memoryMiB: 8192, computePercent: 20, computeLimitPercent: 50}
  - name: gpu-large
    displayName: Large
    image: quay.io/jupyter/pytorch-notebook:cuda12-latest
    cpu: 500m
    memory: 64Gi
    slice: {memoryMiB: 71680, computePercent: 50}
    model: NVIDIA H200
    groups: [ml-team, admins]
quotas:
  defaultUser: {servers: 2, memoryMiB: 32768, computePercent: 100}
  users: {alice: {servers: 4}}
  groups: {ml-team: {servers: 20, memoryMiB: 400000, computePercent: 400}}
`

var (
	small = fleet.Profile{
		Name: "small", DisplayName: "Small", Description: "a small one",
		Image: "quay.io/jupyter/minimal-notebook:latest", CPU: "1", Memory: "4Gi",
		Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}, Sharing: fleet.SharingSliced,
		Args: catalog.DefaultArgs(),
	}
	large = fleet.Profile{
		Name: "gpu-large", DisplayName: "Large",
		Image: "quay.io/jupyter/pytorch-notebook:cuda12-latest", CPU: "500m", Memory: "64Gi",
		Slice: fleet.Slice{MemoryMiB: 71680, ComputePercent: 50, ComputeLimitPercent: 50}, Sharing: fleet.SharingSliced,
		Model: "NVIDIA H200", Groups: []string{"ml-team", "admins"},
		Args: catalog.DefaultArgs(),
	}
)

func TestParseValid(t *testing.T) {
	c, err := catalog.Parse([]byte(valid))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if diff := cmp.Diff([]fleet.Profile{small, large}, c.Profiles()); diff != "" {
		t.Errorf("Profiles (-want +got):\n%s", diff)
	}
	wantQ := fleet.Quotas{
		DefaultUser: fleet.Quota{Servers: 2, MemoryMiB: 32768, ComputePercent: 100},
		Users:       map[string]fleet.Quota{"alice": {Servers: 4}},
		Groups:      map[string]fleet.Quota{"ml-team": {Servers: 20, MemoryMiB: 400000, ComputePercent: 400}},
	}
	if diff := cmp.Diff(wantQ, c.Quotas()); diff != "" {
		t.Errorf("Quotas (-want +got):\n%s", diff)
	}
	got, ok := c.Profile("gpu-large")
	if !ok {
		t.Fatal("Profile(gpu-large) not found")
	}
	if diff := cmp.Diff(large, got); diff != "" {
		t.Errorf("Profile (-want +got):\n%s", diff)
	}
	if _, ok := c.Profile("nope"); ok {
		t.Error("Profile(nope) found")
	}
}

func TestFor(t *testing.T) {
	c, err := catalog.Parse([]byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		groups []string
		want   []string
	}{
		{"no groups see only open profiles", nil, []string{"small"}},
		{"unrelated groups see only open profiles", []string{"other"}, []string{"small"}},
		{"a listed group sees restricted profiles", []string{"other", "admins"}, []string{"small", "gpu-large"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range c.For(tc.groups) {
				got = append(got, p.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAccessorsReturnCopies(t *testing.T) {
	c, err := catalog.Parse([]byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	c.Profiles()[1].Groups[0] = "mutated"
	p, _ := c.Profile("gpu-large")
	p.Groups[0] = "mutated"
	p.Args[0] = "mutated"
	c.For([]string{"admins"})[1].Groups[0] = "mutated"
	c.Quotas().Users["alice"] = fleet.Quota{Servers: 99}
	again, _ := c.Profile("gpu-large")
	if diff := cmp.Diff(large, again); diff != "" {
		t.Errorf("catalog changed through a returned value (-want +got):\n%s", diff)
	}
	if got := c.Quotas().Users["alice"].Servers; got != 4 {
		t.Errorf("alice's quota = %d after mutation of a copy, want 4", got)
	}
}

// TestParseErrors checks each problem's message, and that all of them come
// back at once.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // the error's lines
	}{
		{
			name: "every profile problem at once",
			yaml: `
profiles:
  - name: ok
    displayName: OK
    image: img
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 1, computePercent: 1}
  - name: Bad_Name
    displayName: ""
    image: ""
    cpu: lots
    memory: -1Gi
    slice: {memoryMiB: 0, computePercent: 0, computeLimitPercent: 0}
    groups: [""]
  - name: gpu-large
    displayName: Large
    image: has space
    cpu: "0"
    slice: {memoryMiB: 10, computePercent: 30, computeLimitPercent: 20}
  - name: ok
    displayName: Again
    image: img
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 1, computePercent: 1}
  - displayName: Nameless
    image: img
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 1, computePercent: 1, computeLimitPercent: 101}
`,
			want: []string{
				`profiles[1] (Bad_Name): name "Bad_Name" must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit`,
				`profiles[1] (Bad_Name): displayName is empty`,
				`profiles[1] (Bad_Name): image is empty`,
				`profiles[1] (Bad_Name): cpu "lots" is not a Kubernetes quantity (for example "2", "500m")`,
				`profiles[1] (Bad_Name): memory must be > 0, got "-1Gi"`,
				`profiles[1] (Bad_Name): slice memoryMiB must be > 0, got 0`,
				`profiles[1] (Bad_Name): slice computePercent must be 1..100, got 0`,
				`profiles[1] (Bad_Name): slice computeLimitPercent must be 1..100, got 0`,
				`profiles[1] (Bad_Name): groups[0] is empty`,
				`profiles[2] (gpu-large): image "has space" contains whitespace`,
				`profiles[2] (gpu-large): cpu must be > 0, got "0"`,
				`profiles[2] (gpu-large): memory is empty`,
				`profiles[2] (gpu-large): slice computeLimitPercent must be at least computePercent (30), got 20`,
				`profiles[3] (ok): name "ok" is already used by profiles[0]`,
				`profiles[4]: name is empty`,
				`profiles[4]: slice computeLimitPercent must be 1..100, got 101`,
			},
		},
		{
			name: "negative quotas and empty names",
			yaml: `
profiles:
  - {name: a, displayName: A, image: i, cpu: "1", memory: 1Gi, slice: {memoryMiB: 1, computePercent: 1}}
quotas:
  defaultUser: {servers: -1, memoryMiB: -2, computePercent: -3}
  users: {"": {servers: 1}, bob: {memoryMiB: -5}}
  groups: {ml: {computePercent: -1}}
`,
			want: []string{
				`quotas.defaultUser: servers must be >= 0 (0 = unlimited), got -1`,
				`quotas.defaultUser: memoryMiB must be >= 0 (0 = unlimited), got -2`,
				`quotas.defaultUser: computePercent must be >= 0 (0 = unlimited), got -3`,
				`quotas.users: a user name is empty`,
				`quotas.users.bob: memoryMiB must be >= 0 (0 = unlimited), got -5`,
				`quotas.groups.ml: computePercent must be >= 0 (0 = unlimited), got -1`,
			},
		},
		{
			name: "every unknown field, with its place",
			yaml: `
profile: []
profiles:
  - {name: a, displayName: A, image: i, cpu: "1", memory: 1Gi, slice: {memoryMib: 1, computePercent: 1}, gpus: 1}
quotas:
  users: {bob: {server: 1}}
`,
			want: []string{
				`top level: unknown field "profile" (known: profiles, quotas)`,
				`profiles[0]: unknown field "gpus" (known: args, command, cpu, description, displayName, groups, image, memory, migProfile, model, name, sharing, slice)`,
				`profiles[0].slice: unknown field "memoryMib" (known: computeLimitPercent, computePercent, memoryMiB)`,
				`quotas.users.bob: unknown field "server" (known: computePercent, memoryMiB, servers)`,
			},
		},
		{
			name: "no profiles",
			yaml: "quotas: {}\n",
			want: []string{"profiles: at least one profile is required"},
		},
		{
			name: "empty file",
			yaml: "\n",
			want: []string{"the file is empty"},
		},
		{
			name: "every wrong kind, with its place",
			yaml: `
profiles:
  - {name: a, displayName: A, image: i, cpu: [1], memory: 1Gi, slice: {memoryMiB: lots, computePercent: 1.5}}
  - {name: {x: 1}, displayName: B, image: i, cpu: "1", memory: 1Gi, slice: [], groups: ml}
quotas:
  users: []
  groups: {ml: {servers: "3"}}
`,
			want: []string{
				`profiles[0].cpu: must be a string, got a list`,
				`profiles[0].slice.computePercent: must be a whole number, got the number 1.5`,
				`profiles[0].slice.memoryMiB: must be a whole number, got the string "lots"`,
				`profiles[1].groups: must be a list, got the string "ml"`,
				`profiles[1].name: must be a string, got a mapping`,
				`profiles[1].slice: must be a mapping, got a list`,
				`quotas.groups.ml.servers: must be a whole number, got the string "3"`,
				`quotas.users: must be a mapping, got a list`,
			},
		},
		{
			name: "top level is not a mapping",
			yaml: "- a\n- b\n",
			want: []string{"top level: must be a mapping, got a list"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := catalog.Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded with %d profiles, want errors", len(c.Profiles()))
			}
			if diff := cmp.Diff(tc.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseAcceptsNumbersAsQuantitiesAndNulls(t *testing.T) {
	c, err := catalog.Parse([]byte(`
profiles:
  - name: "7"
    displayName: 7
    description:
    image: i
    cpu: 2
    memory: 1.5
    slice: {memoryMiB: 1024, computePercent: 5}
    groups:
quotas:
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []fleet.Profile{{
		Name: "7", DisplayName: "7", Image: "i", CPU: "2", Memory: "1.5",
		Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 5, ComputeLimitPercent: 5}, Sharing: fleet.SharingSliced,
		Args: catalog.DefaultArgs(),
	}}
	if diff := cmp.Diff(want, c.Profiles()); diff != "" {
		t.Errorf("Profiles (-want +got):\n%s", diff)
	}
}

// TestProfileCommand checks the notebook command a profile gives: the
// docker-stacks default without command and args, its own when it sets
// either, the image's own with explicit empty lists, and a clear problem
// for entries no container can run.
func TestProfileCommand(t *testing.T) {
	const head = "profiles:\n  - {name: p, displayName: P, image: i, cpu: 1, memory: 1Gi, slice: {memoryMiB: 1, computePercent: 1}"
	tests := []struct {
		name          string
		extra         string
		command, args []string
		problem       string
	}{
		{name: "neither set takes the docker-stacks default", args: catalog.DefaultArgs()},
		{name: "args only", extra: `, args: [jupyter, lab]`, args: []string{"jupyter", "lab"}},
		{name: "command and args", extra: `, command: [/usr/bin/python3, -m, notebook], args: ["--ip=$(GPUBROKER_POD_IP)"]`,
			command: []string{"/usr/bin/python3", "-m", "notebook"}, args: []string{"--ip=$(GPUBROKER_POD_IP)"}},
		{name: "empty lists keep the image's", extra: `, command: [], args: []`, command: []string{}, args: []string{}},
		{name: "empty executable", extra: `, command: [""]`, problem: "profiles[0] (p): command[0] is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := catalog.Parse([]byte(head + tc.extra + "}\n"))
			if tc.problem != "" {
				if err == nil || !strings.Contains(err.Error(), tc.problem) {
					t.Fatalf("Parse: %v, want %q", err, tc.problem)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			p := c.Profiles()[0]
			if diff := cmp.Diff(tc.command, p.Command); diff != "" {
				t.Errorf("command (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.args, p.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseRefusesDuplicateKeysAndBadYAML(t *testing.T) {
	for _, y := range []string{
		"profiles: []\nprofiles: []\n",
		"profiles: [\n",
	} {
		if _, err := catalog.Parse([]byte(y)); err == nil || !strings.Contains(err.Error(), "not valid YAML") {
			t.Errorf("Parse(%q) = %v, want a YAML error", y, err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "profiles.yaml")
	if err := os.WriteFile(good, []byte(valid), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := catalog.Load(good)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if n := len(c.Profiles()); n != 2 {
		t.Errorf("%d profiles, want 2", n)
	}
	if _, err := catalog.Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want fs.ErrNotExist", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("profiles: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Load(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("Load(bad) = %v, want an error naming the file", err)
	}
}

// TestDefault pins the embedded dev catalog: sized for one H200
// (143771 MiB, 132 SMs), open to everyone, with finite default quotas.
func TestDefault(t *testing.T) {
	c := catalog.Default()
	type row struct {
		Name  string
		Slice fleet.Slice
	}
	var got []row
	for _, p := range c.Profiles() {
		got = append(got, row{p.Name, p.Slice})
		if len(p.Groups) != 0 || p.Model != "" {
			t.Errorf("profile %s: groups %v, model %q; want open to everyone on any GPU", p.Name, p.Groups, p.Model)
		}
	}
	want := []row{
		{"small", fleet.Slice{MemoryMiB: 8192, ComputePercent: 10, ComputeLimitPercent: 50}},
		{"medium", fleet.Slice{MemoryMiB: 24576, ComputePercent: 25, ComputeLimitPercent: 75}},
		{"large", fleet.Slice{MemoryMiB: 71680, ComputePercent: 50, ComputeLimitPercent: 100}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("default profiles (-want +got):\n%s", diff)
	}
	const h200MiB = 143771
	var sum int64
	for _, r := range want {
		sum += r.Slice.MemoryMiB
	}
	if sum > h200MiB {
		t.Errorf("one slice of each profile needs %d MiB, more than one H200 (%d MiB)", sum, h200MiB)
	}
	q := c.Quotas().DefaultUser
	if q.Servers <= 0 || q.MemoryMiB <= 0 || q.ComputePercent <= 0 {
		t.Errorf("default user quota %+v, want every cap set", q)
	}
}

// TestSharingModes: every sharing mode parses with what it needs, and
// every wrong combination is refused with its place and the reason.
func TestSharingModes(t *testing.T) {
	const head = "profiles:\n"
	prof := func(name, rest string) string {
		return "  - {name: " + name + ", displayName: X, image: i, cpu: \"1\", memory: 1Gi" + rest + "}\n"
	}
	t.Run("each mode with what it needs", func(t *testing.T) {
		c, err := catalog.Parse([]byte(head +
			prof("sl", ", slice: {memoryMiB: 8192, computePercent: 10, computeLimitPercent: 50}") +
			prof("whole", ", sharing: exclusive, model: NVIDIA H200") +
			prof("mig-3g", ", sharing: mig, migProfile: 3g.71gb") +
			prof("mps-30", ", sharing: mps, slice: {memoryMiB: 16384, computePercent: 30}")))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range c.Profiles() {
			got = append(got, fmt.Sprintf("%s %s %q %+v: %s", p.Name, p.Sharing, p.MIGProfile, p.Slice, p.Words()))
		}
		want := []string{
			`sl sliced "" {MemoryMiB:8192 ComputePercent:10 ComputeLimitPercent:50}: time-sliced slice`,
			`whole exclusive "" {MemoryMiB:0 ComputePercent:0 ComputeLimitPercent:0}: whole GPU`,
			`mig-3g mig "3g.71gb" {MemoryMiB:0 ComputePercent:0 ComputeLimitPercent:0}: MIG instance 3g.71gb`,
			`mps-30 mps "" {MemoryMiB:16384 ComputePercent:30 ComputeLimitPercent:30}: MPS client`,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("profiles (-want +got):\n%s", diff)
		}
	})
	_, err := catalog.Parse([]byte(head +
		prof("a", ", sharing: timeshare, slice: {memoryMiB: 1, computePercent: 1}") +
		prof("b", ", sharing: exclusive, slice: {memoryMiB: 1, computePercent: 1}") +
		prof("c", ", sharing: mig") +
		prof("d", ", sharing: mig, migProfile: 3g.71GB, slice: {memoryMiB: 1, computePercent: 1}") +
		prof("e", ", sharing: mps, slice: {memoryMiB: 1, computePercent: 30, computeLimitPercent: 60}") +
		prof("f", ", sharing: mps") +
		prof("g", ", migProfile: 1g.18gb, slice: {memoryMiB: 1, computePercent: 1}") +
		prof("h", "")))
	want := []string{
		`profiles[0] (a): sharing must be one of sliced, exclusive, mig, mps, got "timeshare"`,
		`profiles[1] (b): sharing exclusive takes no slice: the server holds a whole GPU, all of its memory and SMs (use model to choose the kind of GPU)`,
		`profiles[2] (c): sharing mig: migProfile is empty; name a MIG profile such as 1g.18gb or 3g.71gb (nvidia-smi mig -lgip lists a GPU's)`,
		`profiles[3] (d): sharing mig: migProfile "3g.71GB" is not a MIG profile name such as 1g.18gb, 3g.71gb or 1g.18gb+me`,
		`profiles[3] (d): sharing mig takes no slice: a MIG instance's memory and SMs are fixed by its MIG profile`,
		`profiles[4] (e): sharing mps: computeLimitPercent must equal computePercent (30) or be omitted: MPS caps a client's SMs at its active-thread percentage, so an MPS client cannot burst, got 60`,
		`profiles[5] (f): sharing mps needs a slice (memoryMiB and computePercent)`,
		`profiles[6] (g): migProfile "1g.18gb" is only for sharing: mig (this profile is sliced)`,
		`profiles[7] (h): sharing sliced needs a slice (memoryMiB and computePercent)`,
	}
	if err == nil {
		t.Fatal("Parse accepted every combination")
	}
	if diff := cmp.Diff(want, strings.Split(err.Error(), "\n")); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}
