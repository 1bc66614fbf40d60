package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

func TestLoadFlagOverEnvOverDefault(t *testing.T) {
	env := map[string]string{
		"GPUBROKER_AGENT_NODE":            "gpu-7",
		"GPUBROKER_AGENT_REDIS_URL":       "redis://r:6380/1",
		"GPUBROKER_AGENT_SAMPLE_INTERVAL": "2s",
		"GPUBROKER_AGENT_ENFORCE":         "kill",
		"GPUBROKER_AGENT_ENFORCE_SAMPLES": "many", // overridden by the flag: quiet
		"GPUBROKER_LISTEN":                ":1",   // the broker's, not the agent's: no warning
	}
	c, warnings, err := Load([]string{"--sample-interval=500ms", "--enforce-samples=4"}, cliconfigtest.Environ(env))
	if err != nil || len(warnings) > 0 {
		t.Fatalf("Load: %v (warnings %q)", err, warnings)
	}
	got := []any{c.Agent.Node, c.Redis.URL, c.Agent.SampleInterval, c.Agent.Enforcement.Mode, c.Agent.HeartbeatInterval,
		c.Agent.HostRoot, c.Redis.Prefix, c.SampleMaxLen, c.MetricsAddr, c.Agent.Enforcement.Samples}
	want := []any{"gpu-7", "redis://r:6380/1", 500 * time.Millisecond, agent.ModeKill, agent.DefaultHeartbeatInterval,
		agent.DefaultHostRoot, "gpubroker:", int64(3600), ":9400", 4}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
}

// TestLoadReportsEveryProblem gives problems of every kind at once: each
// is reported once, naming its flag with -- and its variable.
func TestLoadReportsEveryProblem(t *testing.T) {
	env := map[string]string{"GPUBROKER_AGENT_ENFORCE_SAMPLES": "many", "GPUBROKER_AGENT_HEARTBEAT_INTERVL": "5s"}
	_, warnings, err := Load([]string{"--enforce=maim", "--redis-prefix={x}", "--log-level=loud", "--sample-maxlen=0",
		"--sample-interval=-1s", "--enforce-tolerance=101", "--metrics-adr=:1", "--metrics-addr=9400"}, cliconfigtest.Environ(env))
	want := []string{
		"--metrics-adr: no such flag; did you mean --metrics-addr? (see gpubroker-agent --help)",
		`GPUBROKER_AGENT_ENFORCE_SAMPLES="many" is not a whole number such as 3 (for --enforce-samples)`,
		"--node (GPUBROKER_AGENT_NODE): is required: the node's name (in a DaemonSet, from spec.nodeName)",
		"--redis-url (GPUBROKER_AGENT_REDIS_URL): a Redis is required: set --redis-url, or --redis-sentinel-master with --redis-sentinel-addrs",
		`--redis-prefix (GPUBROKER_AGENT_REDIS_PREFIX): must not contain braces or whitespace (hash tags are added per key), got "{x}"`,
		"--sample-maxlen (GPUBROKER_AGENT_SAMPLE_MAXLEN): must be at least 1, got 0",
		"--sample-interval (GPUBROKER_AGENT_SAMPLE_INTERVAL): must not be negative, got -1s",
		`--enforce (GPUBROKER_AGENT_ENFORCE): must be report, kill or off, got "maim"`,
		"--enforce-tolerance (GPUBROKER_AGENT_ENFORCE_TOLERANCE): must be 0..100 percent, got 101",
		`--metrics-addr (GPUBROKER_AGENT_METRICS_ADDR): "9400" is not host:port`,
		`--log-level (GPUBROKER_AGENT_LOG_LEVEL): must be one of debug, info, warn, error, got "loud"`,
	}
	if err == nil {
		t.Fatal("Load accepted a bad configuration")
	}
	if diff := cmp.Diff(want, strings.Split(err.Error(), "\n")); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	wantWarnings := []string{"GPUBROKER_AGENT_HEARTBEAT_INTERVL is set, but gpubroker-agent has no such setting; did you mean GPUBROKER_AGENT_HEARTBEAT_INTERVAL?"}
	if diff := cmp.Diff(wantWarnings, warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

func TestHelpListsEveryFlagWithItsEnvTwin(t *testing.T) {
	_, _, err := Load([]string{"--help"}, nil)
	if !errors.Is(err, cliconfig.ErrHelp) {
		t.Fatalf("err = %v, want cliconfig.ErrHelp", err)
	}
	u := usage()
	var c Config
	for _, f := range c.table().Flags {
		if !strings.Contains(u, "  --"+f.Name) || !strings.Contains(u, "env "+envName(f.Name)+",") {
			t.Errorf("help lacks --%s or %s", f.Name, envName(f.Name))
		}
	}
}

// TestConnectNamesEachDependency runs --connect against a real
// redis-server, an API server that is not there and the NVML the machine
// has (none on a CI runner): each is named with its outcome.
func TestConnectNamesEachDependency(t *testing.T) {
	redis := redistest.Start(t)
	kubeconfig := cliconfigtest.DeadKubeconfig(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"--connect", "--node=n1", "--redis-url=" + redis.URL(), "--kubeconfig=" + kubeconfig,
		"--nvml-library=" + filepath.Join(t.TempDir(), "libnvidia-ml.so.1")}, nil, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit %d, want 1\n%s", code, stderr.String())
	}
	for _, want := range []string{
		"gpubroker-agent: configuration is valid\n",
		"connect: redis      ok      " + redis.URL() + " answered in ",
		"connect: kubernetes FAILED  https://127.0.0.1:1, node n1: list this node's pods: ",
		"connect: nvml       FAILED  ",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	if !strings.Contains(stderr.String(), "gpubroker-agent: 2 of 3 dependencies do not answer") {
		t.Errorf("stderr: %s", stderr.String())
	}
}

func TestAgentVersionAndProblems(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version"}, nil, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "gpubroker-agent ") {
		t.Errorf("--version: exit %d, %q", code, stdout.String())
	}
	stdout.Reset()
	if code := run([]string{"--check-config", "--enforce=maim"}, nil, &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "gpubroker-agent: invalid configuration:\n  - --node (GPUBROKER_AGENT_NODE): is required") ||
		!strings.Contains(stderr.String(), "\n  - --enforce (GPUBROKER_AGENT_ENFORCE): must be report, kill or off, got \"maim\"\n") {
		t.Errorf("--check-config with problems: exit %d\n%s", code, stderr.String())
	}
}

// envName is the environment twin of a flag.
func envName(flagName string) string {
	var c Config
	return c.table().EnvName(flagName)
}
