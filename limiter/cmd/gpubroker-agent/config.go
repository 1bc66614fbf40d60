package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpubroker/gpubroker/limiter/agent"
)

// envPrefix starts the environment twin of every flag: --sample-interval
// is GPUBROKER_AGENT_SAMPLE_INTERVAL.
const envPrefix = "GPUBROKER_AGENT_"

// Config is gpubroker-agent's configuration: flag > environment > default.
type Config struct {
	Agent agent.Config
	// EnforceMode is report, kill or off; copied into Agent.Enforcement.Mode.
	EnforceMode string
	// RedisURL is redis://[user:password@]host:port[/db] (rediss:// for TLS).
	RedisURL string
	// RedisSentinelMaster and RedisSentinelAddrs select Sentinel instead.
	RedisSentinelMaster string
	RedisSentinelAddrs  string // comma-separated host:port
	// RedisPasswordFile holds the Redis password; "" = none or the URL's.
	RedisPasswordFile string
	// RedisPrefix starts every key; must equal the broker's. Default "gpubroker:".
	RedisPrefix string
	// SampleMaxLen is the approximate number of samples kept per slice.
	SampleMaxLen int64
	// NVMLLibrary is the path of libnvidia-ml.so.1; "" = the system's.
	NVMLLibrary string
	// ProcRoot is the host's proc(5) tree; default /proc (hostPID: true).
	ProcRoot string
	// Kubeconfig is a kubeconfig path; "" = in-cluster config.
	Kubeconfig string
	// MetricsAddr is where /metrics and /healthz listen; default ":9400".
	MetricsAddr string
	// LogLevel is debug, info, warn or error; default info.
	LogLevel string
	// CheckConfig validates and exits.
	CheckConfig bool
}

func register(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.Agent.Node, "node", "", "Kubernetes node name of this agent (required; in a DaemonSet from spec.nodeName).")
	fs.StringVar(&c.RedisURL, "redis-url", "", "Redis: redis://[user:password@]host:port[/db] or rediss:// (or use Sentinel).")
	fs.StringVar(&c.RedisSentinelMaster, "redis-sentinel-master", "", "Redis Sentinel master name (alternative to --redis-url).")
	fs.StringVar(&c.RedisSentinelAddrs, "redis-sentinel-addrs", "", "Comma-separated Redis Sentinel addresses, host:port.")
	fs.StringVar(&c.RedisPasswordFile, "redis-password-file", "", "File holding the Redis password.")
	fs.StringVar(&c.RedisPrefix, "redis-prefix", "gpubroker:", "Prefix of every Redis key; must equal the broker's.")
	fs.Int64Var(&c.SampleMaxLen, "sample-maxlen", 3600, "Approximate samples kept per slice (Redis stream MAXLEN ~); 3600 = 1 h at 1 Hz.")
	fs.StringVar(&c.Agent.HostRoot, "host-root", agent.DefaultHostRoot, "Host directory with slices/<id>/quota and usage (the broker's host root).")
	fs.StringVar(&c.ProcRoot, "proc-root", agent.DefaultProcRoot, "The host's /proc (the agent needs the host pid namespace).")
	fs.StringVar(&c.NVMLLibrary, "nvml-library", "", "Path of libnvidia-ml.so.1; empty uses the system's.")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "Kubeconfig for watching this node's pods; empty uses the in-cluster config.")
	fs.DurationVar(&c.Agent.SampleInterval, "sample-interval", agent.DefaultSampleInterval, "Time between usage samples.")
	fs.DurationVar(&c.Agent.HeartbeatInterval, "heartbeat-interval", agent.DefaultHeartbeatInterval, "Time between node reports; the broker counts the node stale after three.")
	fs.DurationVar(&c.Agent.QuotaResync, "quota-resync", agent.DefaultQuotaResync, "Time between full passes over desired quotas (changes also arrive by pub/sub).")
	fs.DurationVar(&c.Agent.PaceInterval, "pace-interval", agent.DefaultPaceInterval, "Time between the slice utilization samples written into the usage regions for the hooks' compute pacing; negative turns them off.")
	fs.StringVar(&c.EnforceMode, "enforce", string(agent.DefaultMode), "What to do with a process over its slice, hidden from the hook, or in no slice: kill (stop it), report or off (always audited; host processes are only reported).")
	fs.IntVar(&c.Agent.Enforcement.TolerancePercent, "enforce-tolerance", 5, "Percent above its memory cap a slice may go before it counts as over.")
	fs.IntVar(&c.Agent.Enforcement.Samples, "enforce-samples", 3, "Consecutive samples a violation must last before the agent acts.")
	fs.DurationVar(&c.Agent.Enforcement.OrphanGrace, "enforce-orphan-grace", 30*time.Second, "How long a GPU process must be in no slice before the agent acts (pods the watcher has not seen yet).")
	fs.BoolVar(&c.Agent.TrustUsagePIDs, "trust-usage-pids", false, "Also map processes outside pod cgroups to slices by the usage regions' pids (advisory; tests and bare metal only).")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":9400", "Listen address of /metrics (Prometheus) and /healthz.")
	fs.StringVar(&c.LogLevel, "log-level", "info", "Log level: debug, info, warn or error (JSON on stderr).")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "Validate the configuration, print every problem and exit.")
}

// envName is the environment twin of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// usage is the --help text: every flag with its env twin and default.
func usage() string {
	var c Config
	fs := flag.NewFlagSet("gpubroker-agent", flag.ContinueOnError)
	register(fs, &c)
	var b strings.Builder
	b.WriteString(`gpubroker-agent: the gpubroker node agent (one per GPU node, as a DaemonSet).

It registers the node's GPUs with a heartbeat, samples per-slice GPU use from
NVML into Redis, writes live quota files for the in-pod limiter, and reports
or kills processes that bypass their slice.

Usage: gpubroker-agent [flags]

Every flag also reads its environment variable; a flag given on the command
line wins over the environment, which wins over the default.

`)
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		def := f.DefValue
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(w, "  --%s\t%s\t(default %s)\n      \t%s\n", f.Name, envName(f.Name), def, f.Usage)
	})
	_ = w.Flush() // writes into a strings.Builder cannot fail
	return b.String()
}

// Load parses args over the environment (getenv) over the defaults. With
// -h or --help it writes the usage to help and returns flag.ErrHelp. Every
// problem, including Validate's, is reported at once.
func Load(args []string, getenv func(string) string, help io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("gpubroker-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	register(fs, &c)
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if help != nil {
				_, _ = io.WriteString(help, usage()) // nothing to report if help cannot be written
			}
			return c, flag.ErrHelp
		}
		errs = append(errs, fmt.Errorf("%w (see gpubroker-agent --help)", err))
	} else if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q (see gpubroker-agent --help)", fs.Args()))
	}
	c.Agent.Enforcement.Mode = agent.Mode(c.EnforceMode)
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

// Validate reports every problem at once. It reads nothing but the
// password file's existence.
func (c Config) Validate() error {
	var errs []error
	if err := c.Agent.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.RedisURL == "" && c.RedisSentinelMaster == "":
		errs = append(errs, errors.New("redis: set --redis-url or --redis-sentinel-master"))
	case c.RedisURL != "" && c.RedisSentinelMaster != "":
		errs = append(errs, errors.New("redis: set --redis-url or --redis-sentinel-master, not both"))
	case c.RedisSentinelMaster != "" && c.RedisSentinelAddrs == "":
		errs = append(errs, errors.New("redis: --redis-sentinel-master needs --redis-sentinel-addrs"))
	}
	if strings.ContainsAny(c.RedisPrefix, "{}") {
		errs = append(errs, fmt.Errorf("redis prefix %q must not contain '{' or '}'", c.RedisPrefix))
	}
	if c.RedisPasswordFile != "" {
		if _, err := os.Stat(c.RedisPasswordFile); err != nil {
			errs = append(errs, fmt.Errorf("redis password file: %w", err))
		}
	}
	if c.SampleMaxLen < 1 {
		errs = append(errs, fmt.Errorf("sample maxlen must be >= 1, got %d", c.SampleMaxLen))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log level must be debug, info, warn or error, got %q", c.LogLevel))
	}
	return errors.Join(errs...)
}

// defaultTimeout bounds Redis dial, read and write as a backstop to the
// per-operation context deadlines.
const defaultTimeout = 3 * time.Second
