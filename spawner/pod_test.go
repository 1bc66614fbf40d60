package spawner

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func testConfig() Config {
	return Config{Namespace: "notebooks"}.WithDefaults()
}

func testSpec() Spec {
	return Spec{
		User:        "alice",
		Server:      "",
		SpawnID:     "01jd5k8m2x7q4v9n3b6c0r1t2y",
		Profile:     "small",
		Image:       "quay.io/jupyter/minimal-notebook:2024-10-07",
		CPU:         "500m",
		Memory:      "4Gi",
		Slice:       v1.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50},
		GPU:         v1.GPURef{UUID: "GPU-4b2c6f1e-8d3a-4c5b-9e7f-0a1b2c3d4e5f", Node: "gpu-1", Model: "NVIDIA H200"},
		QuotaGroups: []string{"ml-team", "everyone"},
		Env:         map[string]string{"JUPYTERHUB_USER": "alice", "A_FIRST": "1"},
	}
}

func TestPodGolden(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(Config) Config
		spec func(Spec) Spec
	}{
		{name: "nvidia-runtime"},
		{
			name: "cdi",
			cfg: func(c Config) Config {
				c.Exposure = ExposureCDI
				c.HostRoot = "/opt/gpubroker"
				c.ImagePullPolicy = corev1.PullIfNotPresent
				c.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
				return c
			},
		},
		{
			name: "secret-env",
			spec: func(s Spec) Spec {
				s.Server = "experiments"
				s.SecretEnv = true
				return s
			},
		},
		{
			// What the JupyterHub spawner class sends: the hub's command as
			// args, so the image's entrypoint still runs first.
			name: "hub-args",
			spec: func(s Spec) Spec {
				s.Server = "(default)"
				s.SecretEnv = true
				s.Args = []string{"jupyterhub-singleuser", "--debug"}
				return s
			},
		},
		{
			name: "command-args",
			spec: func(s Spec) Spec {
				s.Command = []string{"tini", "-g", "--"}
				s.Args = []string{"start-notebook.py", ""}
				return s
			},
		},
		{
			// A whole GPU: the hook still accounts and caps memory at the
			// GPU's size; the agent writes its quota unpaced.
			name: "exclusive",
			spec: func(s Spec) Spec {
				s.Profile, s.Sharing = "whole-h200", v1.SharingExclusive
				s.Slice = v1.Slice{MemoryMiB: 143771, ComputePercent: 100, ComputeLimitPercent: 100}
				return s
			},
		},
		{
			// A MIG instance: the pod gets the instance's MIG UUID, with
			// the runtime and with CDI.
			name: "mig",
			spec: func(s Spec) Spec {
				s.Profile, s.Sharing = "mig-3g", v1.SharingMIG
				s.Slice = v1.Slice{MemoryMiB: 72704, ComputePercent: 36, ComputeLimitPercent: 36}
				s.GPU = v1.GPURef{UUID: "MIG-6a1f0c3e-2b4d-5e8f-9a0b-1c2d3e4f5a6b", Node: "gpu-1", Model: "NVIDIA H200",
					MIGProfile: "3g.71gb", ParentUUID: "GPU-4b2c6f1e-8d3a-4c5b-9e7f-0a1b2c3d4e5f"}
				return s
			},
		},
		{
			name: "mig-cdi",
			cfg: func(c Config) Config {
				c.Exposure = ExposureCDI
				return c
			},
			spec: func(s Spec) Spec {
				s.Profile, s.Sharing = "mig-1g", v1.SharingMIG
				s.Slice = v1.Slice{MemoryMiB: 18432, ComputePercent: 12, ComputeLimitPercent: 12}
				s.GPU = v1.GPURef{UUID: "MIG-0d9e8f7a-6b5c-4d3e-2f1a-0b9c8d7e6f5a", Node: "gpu-1", Model: "NVIDIA H200",
					MIGProfile: "1g.18gb", ParentUUID: "GPU-4b2c6f1e-8d3a-4c5b-9e7f-0a1b2c3d4e5f"}
				return s
			},
		},
		{
			// An MPS client: the GPU's pipe directory read-only at the
			// clients' default path and the node's MPS shared memory; no
			// variable carries a limit.
			name: "mps",
			spec: func(s Spec) Spec {
				s.Profile, s.Sharing = "mps-30", v1.SharingMPS
				s.Slice = v1.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 30}
				return s
			},
		},
		{
			name: "unicode-user",
			spec: func(s Spec) Spec {
				s.User = "Zoë.Ünal@Example.org"
				s.Server = "Mon Carnet 📓"
				s.QuotaGroups = nil
				s.Env = nil
				return s
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, spec := testConfig(), testSpec()
			if tc.cfg != nil {
				cfg = tc.cfg(cfg)
			}
			if tc.spec != nil {
				spec = tc.spec(spec)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("config: %v", err)
			}
			pod, err := Pod(cfg, spec)
			if err != nil {
				t.Fatalf("Pod: %v", err)
			}
			got, err := yaml.Marshal(pod)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			golden(t, filepath.Join("testdata", tc.name+".golden"), got)

			again, err := Pod(cfg, spec)
			if err != nil {
				t.Fatalf("Pod again: %v", err)
			}
			if diff := cmp.Diff(pod, again); diff != "" {
				t.Errorf("Pod is not deterministic (-first +second):\n%s", diff)
			}
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./spawner/ -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got):\n%s", path, diff)
	}
}

// gpubrokerEnv lists the container's GPUBROKER_ variables: only the
// notebook's address, never a limit, a path of the limiter or the slice's
// identity (ARCHITECTURE.md invariant 3: the environment belongs to the tenant).
func gpubrokerEnv(env []corev1.EnvVar) []string {
	var out []string
	for _, e := range env {
		if strings.HasPrefix(e.Name, "GPUBROKER_") {
			out = append(out, e.Name)
		}
	}
	return out
}

// TestPodContract checks the ARCHITECTURE.md pod contract on the built object, so a
// regenerated golden file cannot silently drop it.
func TestPodContract(t *testing.T) {
	cfg, spec := testConfig(), testSpec()
	spec.SecretEnv = true
	pod, err := Pod(cfg, spec)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		hostPaths[v.Name] = v.HostPath.Path
	}
	got := map[string]any{
		"managed-by":    pod.Labels[v1.LabelManagedBy],
		"node":          pod.Spec.NodeName,
		"visible":       env["NVIDIA_VISIBLE_DEVICES"],
		"gpubroker env": gpubrokerEnv(c.Env),
		"hook ro":       mounts[v1.PodHookDir].ReadOnly,
		"preload ro":    mounts[v1.PodPreload].ReadOnly,
		"quota ro":      mounts[v1.PodQuotaDir].ReadOnly,
		"usage ro":      mounts[v1.PodUsageDir].ReadOnly,
		"quota host":    hostPaths[mounts[v1.PodQuotaDir].Name],
		"usage host":    hostPaths[mounts[v1.PodUsageDir].Name],
		"preload":       hostPaths[mounts[v1.PodPreload].Name],
		"secret":        c.EnvFrom[0].SecretRef.Name,
		"automount":     *pod.Spec.AutomountServiceAccountToken,
		"escalation":    *c.SecurityContext.AllowPrivilegeEscalation,
		"mem limit":     c.Resources.Limits.Memory().String(),
		"runtime":       *pod.Spec.RuntimeClassName,
		"restart":       pod.Spec.RestartPolicy,
		"port":          c.Ports[0].ContainerPort,
		"annotations":   len(pod.Annotations),
	}
	want := map[string]any{
		"managed-by":    "gpubroker",
		"node":          "gpu-1",
		"visible":       spec.GPU.UUID,
		"gpubroker env": []string{v1.EnvBaseURL, v1.EnvPodIP}, // the notebook's address only: the slice reaches the hook only through the read-only quota mount
		"hook ro":       true,
		"preload ro":    true,
		"quota ro":      true,
		"usage ro":      false,
		"quota host":    "/var/lib/gpubroker/slices/" + spec.SpawnID + "/quota",
		"usage host":    "/var/lib/gpubroker/slices/" + spec.SpawnID + "/usage",
		"preload":       "/var/lib/gpubroker/hook/ld.so.preload",
		"secret":        "nb-alice-env",
		"automount":     false,
		"escalation":    false,
		"mem limit":     "4Gi",
		"runtime":       "nvidia",
		"restart":       corev1.RestartPolicyOnFailure,
		"port":          int32(8888),
		"annotations":   11,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pod contract (-want +got):\n%s", diff)
	}
}

func TestPodInvalid(t *testing.T) {
	tests := []struct {
		name  string
		spec  func(Spec) Spec
		wants []string // substrings of the error
	}{
		{name: "empty image", spec: func(s Spec) Spec { s.Image = ""; return s }, wants: []string{"image"}},
		{name: "bad cpu quantity", spec: func(s Spec) Spec { s.CPU = "lots"; return s }, wants: []string{"cpu quantity \"lots\""}},
		{name: "negative memory", spec: func(s Spec) Spec { s.Memory = "-1Gi"; return s }, wants: []string{"memory quantity \"-1Gi\" must be positive"}},
		{name: "spawn id with slash", spec: func(s Spec) Spec { s.SpawnID = "../etc"; return s }, wants: []string{"spawn id"}},
		{name: "empty user", spec: func(s Spec) Spec { s.User = ""; return s }, wants: []string{"user is empty"}},
		{name: "slice out of range", spec: func(s Spec) Spec {
			s.Slice = v1.Slice{MemoryMiB: 0, ComputePercent: 50, ComputeLimitPercent: 20}
			return s
		},
			wants: []string{"slice memory 0 MiB", "compute limit 20% must be 50..100"}},
		{name: "reserved env", spec: func(s Spec) Spec { s.Env = map[string]string{"GPUBROKER_MEMORY_LIMIT_MIB": "99999"}; return s }, wants: []string{"reserved"}},
		{name: "invalid env name", spec: func(s Spec) Spec { s.Env = map[string]string{"A=B": "x"}; return s }, wants: []string{"env \"A=B\""}},
		{name: "group with comma", spec: func(s Spec) Spec { s.QuotaGroups = []string{"a,b"}; return s }, wants: []string{"quota group"}},
		{name: "empty program name", spec: func(s Spec) Spec { s.Command = []string{"", "x"}; return s }, wants: []string{"command[0] is empty"}},
		{name: "missing gpu", spec: func(s Spec) Spec { s.GPU = v1.GPURef{}; return s }, wants: []string{"gpu uuid", "gpu node"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := Pod(testConfig(), tc.spec(testSpec()))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Pod error = %v, want ErrInvalid", err)
			}
			if pod != nil {
				t.Errorf("Pod returned a pod with an error")
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	if err := testConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := Config{Namespace: "Bad_NS", HostRoot: "rel/path", Exposure: "magic", NotebookPort: 70000, StartTimeout: -1, ErrorGrace: -1, ImagePullPolicy: "Sometimes"}
	err := bad.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, w := range []string{"namespace", "host root", "exposure", "notebook port", "start timeout", "error grace", "image pull policy"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func TestSecret(t *testing.T) {
	spec := testSpec()
	got := Secret(testConfig(), spec, map[string]string{"JUPYTERHUB_API_TOKEN": "s3cret"})
	want := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        "nb-alice-env",
			Namespace:   "notebooks",
			Labels:      Labels(spec.User, spec.Server, spec.SpawnID),
			Annotations: map[string]string{v1.AnnotationUser: "alice", v1.AnnotationServer: "", v1.AnnotationSpawnID: spec.SpawnID},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"JUPYTERHUB_API_TOKEN": []byte("s3cret")},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Secret (-want +got):\n%s", diff)
	}
	pod, err := Pod(testConfig(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := yaml.Marshal(pod); strings.Contains(string(raw), "s3cret") {
		t.Error("secret value appears in the pod")
	}
}

func TestParsePodRoundTrip(t *testing.T) {
	for _, mod := range []func(Spec) Spec{
		func(s Spec) Spec { return s },
		func(s Spec) Spec { s.User, s.Server, s.QuotaGroups = "Zoë@Example.org", "Mon Carnet", nil; return s },
		func(s Spec) Spec {
			s.Sharing = v1.SharingMIG
			s.GPU = v1.GPURef{UUID: "MIG-6a1f", Node: "gpu-1", MIGProfile: "1g.18gb+me", ParentUUID: "GPU-4b2c"}
			return s
		},
		func(s Spec) Spec { s.Sharing = v1.SharingMPS; return s },
		func(s Spec) Spec { s.IdempotencyKey = "hub-spawn-7"; return s },
	} {
		spec := mod(testSpec())
		pod, err := Pod(testConfig(), spec)
		if err != nil {
			t.Fatal(err)
		}
		created := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
		pod.CreationTimestamp = metav1.NewTime(created)
		pod.Status.PodIP = "10.88.0.7"
		got, err := ParsePod(pod)
		if err != nil {
			t.Fatalf("ParsePod: %v", err)
		}
		want := ManagedPod{
			Name: PodName(spec.User, spec.Server), User: spec.User, Server: spec.Server, Profile: spec.Profile,
			SpawnID: spec.SpawnID, Node: spec.GPU.Node, GPUUUID: spec.GPU.UUID, Slice: spec.Slice,
			Sharing: spec.Sharing, MIGProfile: spec.GPU.MIGProfile, ParentUUID: spec.GPU.ParentUUID,
			QuotaGroups: spec.QuotaGroups, IdempotencyKey: spec.IdempotencyKey, URL: "http://10.88.0.7:8888", CreatedAt: created,
			Held: true, // every pod is created with v1.FinalizerServerRecord
		}
		if want.Sharing == "" {
			want.Sharing = v1.SharingSliced
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ParsePod (-want +got):\n%s", diff)
		}
	}
}

func TestParsePodErrors(t *testing.T) {
	base, err := Pod(testConfig(), testSpec())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mutate  func(*corev1.Pod)
		wantErr error
		wants   []string
	}{
		{name: "not managed", mutate: func(p *corev1.Pod) { delete(p.Labels, v1.LabelManagedBy) }, wantErr: ErrNotOwned},
		{name: "missing spawn id", mutate: func(p *corev1.Pod) { delete(p.Annotations, v1.AnnotationSpawnID) }, wants: []string{"annotation gpubroker.io/spawn-id is missing"}},
		{name: "garbled memory", mutate: func(p *corev1.Pod) { p.Annotations[v1.AnnotationMemoryMiB] = "8Gi" }, wants: []string{`memory-mib="8Gi" is not an integer`}},
		{name: "label disagrees", mutate: func(p *corev1.Pod) { p.Labels[v1.LabelSpawnID] = "other" }, wants: []string{"disagrees"}},
		{name: "two problems", mutate: func(p *corev1.Pod) {
			delete(p.Annotations, v1.AnnotationGPUUUID)
			p.Annotations[v1.AnnotationComputePercent] = "x"
		}, wants: []string{"gpu-uuid is missing", `compute-percent="x"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := base.DeepCopy()
			tc.mutate(pod)
			_, err := ParsePod(pod)
			if err == nil {
				t.Fatal("ParsePod accepted a bad pod")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func BenchmarkPod(b *testing.B) {
	cfg, spec := testConfig(), testSpec()
	for b.Loop() {
		if _, err := Pod(cfg, spec); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseAndClassify(b *testing.B) {
	pod, err := Pod(testConfig(), testSpec())
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for b.Loop() {
		if _, err := ParsePod(pod); err != nil {
			b.Fatal(err)
		}
		Classify(pod, now, Config{})
	}
}
