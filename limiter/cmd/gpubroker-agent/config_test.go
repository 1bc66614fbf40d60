package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/limiter/agent"
)

func TestLoadFlagOverEnvOverDefault(t *testing.T) {
	env := map[string]string{
		"GPUBROKER_AGENT_NODE":            "gpu-7",
		"GPUBROKER_AGENT_REDIS_URL":       "redis://r:6380/1",
		"GPUBROKER_AGENT_SAMPLE_INTERVAL": "2s",
		"GPUBROKER_AGENT_ENFORCE":         "kill",
	}
	c, err := Load([]string{"--sample-interval=500ms"}, func(k string) string { return env[k] }, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Agent.Node, c.RedisURL, c.Agent.SampleInterval, c.Agent.Enforcement.Mode, c.Agent.HeartbeatInterval,
		c.Agent.HostRoot, c.RedisPrefix, c.SampleMaxLen, c.MetricsAddr}
	want := []any{"gpu-7", "redis://r:6380/1", 500 * time.Millisecond, agent.ModeKill, agent.DefaultHeartbeatInterval,
		agent.DefaultHostRoot, "gpubroker:", int64(3600), ":9400"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
}

func TestLoadReportsEveryProblem(t *testing.T) {
	env := map[string]string{"GPUBROKER_AGENT_ENFORCE_SAMPLES": "many"}
	_, err := Load([]string{"--enforce=maim", "--redis-prefix={x}", "--log-level=loud", "--sample-maxlen=0"},
		func(k string) string { return env[k] }, nil)
	if err == nil {
		t.Fatal("Load accepted a bad configuration")
	}
	for _, want := range []string{"GPUBROKER_AGENT_ENFORCE_SAMPLES", "node name", "enforcement mode", "redis: set", "redis prefix", "log level", "maxlen"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestHelpListsEveryFlagWithItsEnvTwin(t *testing.T) {
	var b strings.Builder
	_, err := Load([]string{"--help"}, func(string) string { return "" }, &b)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	var c Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	register(fs, &c)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(b.String(), "--"+f.Name) || !strings.Contains(b.String(), envName(f.Name)) {
			t.Errorf("help lacks --%s or %s", f.Name, envName(f.Name))
		}
	})
}
