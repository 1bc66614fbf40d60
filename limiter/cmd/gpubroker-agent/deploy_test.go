package main

import (
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpubroker/gpubroker/limiter/agent"
)

// TestDaemonSetMatchesTheAgent keeps deploy/agent/daemonset.yaml true to
// the agent: every GPUBROKER_AGENT_* variable it sets is a flag's twin, the
// configuration it gives is valid, and the pod has what the agent needs.
func TestDaemonSetMatchesTheAgent(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/agent/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("the agent needs hostPID to map NVML pids to pods")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, envPrefix) {
			continue
		}
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			v = "gpu-node-1"
		}
		env[e.Name] = v
	}
	known := map[string]bool{}
	var c0 Config
	for _, f := range c0.table().Flags {
		known[envName(f.Name)] = true
	}
	var environ []string
	for name, v := range env {
		if !known[name] {
			t.Errorf("daemonset sets %s, which is no flag's twin", name)
		}
		environ = append(environ, name+"="+v)
	}
	cfg, warnings, err := Load(nil, environ)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("daemonset configuration: %v (warnings %q)", err, warnings)
	}
	if cfg.Agent.Node != "gpu-node-1" {
		t.Errorf("node %q, want it from spec.nodeName", cfg.Agent.Node)
	}
	if cfg.Agent.Enforcement.Mode != agent.ModeKill {
		t.Errorf("enforcement %q, want the protecting %q (ARCHITECTURE.md invariant 3)", cfg.Agent.Enforcement.Mode, agent.ModeKill)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.MountPath == cfg.Agent.HostRoot && !m.ReadOnly
	}
	if !mounted || cfg.Agent.HostRoot != agent.DefaultHostRoot {
		t.Errorf("host root %s must be mounted read-write (default %s)", cfg.Agent.HostRoot, agent.DefaultHostRoot)
	}
}
