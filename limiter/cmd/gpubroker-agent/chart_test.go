package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpubroker/gpubroker/deploy/helm/render"
	"github.com/gpubroker/gpubroker/limiter/agent"
)

// TestChartConfiguresTheAgent loads the environment the Helm chart's
// DaemonSet gives the agent, for every documented combination of values,
// through the agent's own flag table: every GPUBROKER_AGENT_* variable is a
// flag's twin (no warning), and the configuration is valid.
func TestChartConfiguresTheAgent(t *testing.T) {
	examples, err := render.Examples()
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range examples {
		t.Run(ex.Name, func(t *testing.T) {
			r, err := render.Render(render.Options{Values: []string{ex.Values}})
			if err != nil {
				t.Fatal(err)
			}
			ds, err := r.DaemonSet("agent")
			if err != nil {
				t.Fatal(err)
			}
			c := ds.Spec.Template.Spec.Containers[0]
			if len(c.Args) > 0 || len(c.Command) > 0 {
				t.Errorf("the DaemonSet passes command %q args %q; the chart configures the agent by environment only", c.Command, c.Args)
			}
			// Files the DaemonSet mounts from Secrets are made under a temp
			// dir, at their mount paths, and the variables pointed there.
			root := t.TempDir()
			secretMounts := map[string]bool{}
			for _, vol := range ds.Spec.Template.Spec.Volumes {
				secretMounts[vol.Name] = vol.Secret != nil
			}
			var environ []string
			for _, e := range c.Env {
				v := e.Value
				for _, m := range c.VolumeMounts {
					if secretMounts[m.Name] && strings.HasPrefix(v, m.MountPath+"/") {
						v = filepath.Join(root, v)
						if err := os.MkdirAll(filepath.Dir(v), 0o755); err != nil {
							t.Fatal(err)
						}
						if err := os.WriteFile(v, []byte("secret\n"), 0o600); err != nil {
							t.Fatal(err)
						}
					}
				}
				switch {
				case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
					v = "gpu-node-1"
				case e.ValueFrom != nil:
					t.Errorf("%s comes from %+v, which this test cannot stand in for", e.Name, e.ValueFrom)
				}
				if !strings.HasPrefix(e.Name, envPrefix) && !strings.HasPrefix(e.Name, "NVIDIA_") {
					t.Errorf("the DaemonSet sets %s, which is neither the agent's nor the NVIDIA runtime's", e.Name)
				}
				environ = append(environ, e.Name+"="+v)
			}
			cfg, warnings, err := Load(nil, environ)
			if len(warnings) > 0 {
				t.Errorf("the agent warns about the DaemonSet's environment: %q", warnings)
			}
			if err != nil {
				t.Fatalf("the DaemonSet's environment does not load: %v", err)
			}
			want := agent.Mode(r.Values["agent"].(map[string]any)["enforce"].(string))
			if want == "" {
				want = agent.ModeKill // the agent's default, which the chart keeps
			}
			if cfg.Agent.Enforcement.Mode != want {
				t.Errorf("enforcement %q, want %q (the protecting kill unless the values say otherwise: ARCHITECTURE.md invariant 3)", cfg.Agent.Enforcement.Mode, want)
			}
			mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == cfg.Agent.HostRoot && !m.ReadOnly })
			if !mounted {
				t.Errorf("host root %s must be mounted read-write", cfg.Agent.HostRoot)
			}
			if cfg.Agent.Node != "gpu-node-1" || cfg.Namespace != r.Values["notebooks"].(map[string]any)["namespace"] {
				t.Errorf("node %q namespace %q: want spec.nodeName and the notebooks' namespace", cfg.Agent.Node, cfg.Namespace)
			}
		})
	}
}
