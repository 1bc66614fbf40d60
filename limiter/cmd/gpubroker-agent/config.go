package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

// envPrefix starts the environment twin of every flag: --sample-interval
// is GPUBROKER_AGENT_SAMPLE_INTERVAL.
const envPrefix = "GPUBROKER_AGENT_"

// Config is gpubroker-agent's configuration: flag > environment > default.
type Config struct {
	Agent agent.Config
	// EnforceMode is report, kill or off; copied into Agent.Enforcement.Mode.
	EnforceMode string
	// EnforceComputeMode is the same for over-compute; copied into
	// Agent.Enforcement.ComputeMode.
	EnforceComputeMode string
	// Redis is the broker's Redis (URL or Sentinel, password file, prefix).
	Redis cliconfig.Redis
	// SampleMaxLen is the approximate number of samples kept per slice.
	SampleMaxLen int64
	// NVMLLibrary is the path of libnvidia-ml.so.1; "" = the system's.
	NVMLLibrary string
	// ProcRoot is the host's proc(5) tree; default /proc (hostPID: true).
	ProcRoot string
	// Kube is the API server, for watching this node's pods; "" kubeconfig
	// means the in-cluster config.
	Kube cliconfig.Kube
	// Namespace is the notebook pods' namespace (the broker's --namespace);
	// "" watches every namespace.
	Namespace string
	// MetricsAddr is where /metrics and /healthz listen; default ":9400".
	MetricsAddr string
	// LogLevel is debug, info, warn or error; default info.
	LogLevel string
	// CheckConfig validates and exits.
	CheckConfig bool
	// Connect validates, contacts Redis, the API server and NVML, and
	// exits; it implies CheckConfig.
	Connect bool
}

// table is the agent's flag table bound to c.
func (c *Config) table() *cliconfig.Table {
	t := &cliconfig.Table{
		Program: "gpubroker-agent",
		Summary: `gpubroker-agent is the gpubroker node agent (one per GPU node, as a DaemonSet).

It registers the node's GPUs with a heartbeat, samples per-slice GPU use from
NVML into Redis, lays out each new slice and writes its live quota files for
the in-pod limiter, and stops (or, with --enforce=report, reports) processes
that bypass their slice.`,
		EnvPrefix: envPrefix,
	}
	add := func(fs ...cliconfig.Flag) { t.Flags = append(t.Flags, fs...) }
	add(cliconfig.Flag{Name: "node", Placeholder: "NAME", Value: cliconfig.String(&c.Agent.Node), DefaultDoc: "none, required",
		Help: "Kubernetes node name of this agent (in a DaemonSet from spec.nodeName).",
		Check: func() error {
			if c.Agent.Node == "" {
				return errors.New("is required: the node's name (in a DaemonSet, from spec.nodeName)")
			}
			return nil
		}})
	add(c.Redis.Flags(cliconfig.RedisRequirement{Required: true, URLDefault: "none; required unless Sentinel is set"})...)
	add(cliconfig.Flag{Name: "sample-maxlen", Placeholder: "N", Value: cliconfig.Int64(&c.SampleMaxLen), Default: "3600",
		Help:  "Samples kept per slice (Redis stream MAXLEN ~; 3600 = 1 h at 1 Hz, about 196 KB per slice).",
		Check: cliconfig.AtLeast(&c.SampleMaxLen, 1)})
	add(cliconfig.Flag{Name: "host-root", Placeholder: "PATH", Value: cliconfig.String(&c.Agent.HostRoot), Default: agent.DefaultHostRoot,
		Help: "Host directory holding slices/<id>/quota and usage (the broker's --host-root)."})
	add(cliconfig.Flag{Name: "proc-root", Placeholder: "PATH", Value: cliconfig.String(&c.ProcRoot), Default: agent.DefaultProcRoot,
		Help: "The host's proc tree (the agent needs the host pid namespace)."})
	add(cliconfig.Flag{Name: "nvml-library", Placeholder: "PATH", Value: cliconfig.String(&c.NVMLLibrary), DefaultDoc: "the system's",
		Help: "Path of libnvidia-ml.so.1."})
	add(c.Kube.Flags(cliconfig.KubeDefaults{Kubeconfig: "none: in-cluster config", QPS: 5, Burst: 10,
		Source: "client-go's too: the agent lists and watches one node's pods"})...)
	add(cliconfig.Flag{Name: "namespace", Placeholder: "NAME", Value: cliconfig.String(&c.Namespace), DefaultDoc: "every namespace",
		Help: "Namespace of the notebook pods (the broker's --namespace), so that a Role there is all the agent needs; empty: every namespace (a ClusterRole).",
		Check: func() error {
			if c.Namespace != "" && (len(c.Namespace) > 63 || !dns1123Label.MatchString(c.Namespace)) {
				return fmt.Errorf("%q is not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)", c.Namespace)
			}
			return nil
		}})
	add(nonNegative("sample-interval", &c.Agent.SampleInterval, agent.DefaultSampleInterval,
		"Time between usage samples; samples are stale after three intervals."))
	add(nonNegative("heartbeat-interval", &c.Agent.HeartbeatInterval, agent.DefaultHeartbeatInterval,
		"Time between node reports; the broker counts the node stale after three."))
	add(cliconfig.Flag{Name: "pace-interval", Placeholder: "DURATION", Value: cliconfig.Duration(&c.Agent.PaceInterval), Default: agent.DefaultPaceInterval.String(),
		Help: "Time between the slice SM use written into the usage regions for the hooks' compute pacing (they see only host pids through NVML); negative turns it off."})
	add(nonNegative("quota-resync", &c.Agent.QuotaResync, agent.DefaultQuotaResync,
		"Time between full passes over desired quotas (changes also arrive by pub/sub)."))
	add(modeFlag("enforce", &c.EnforceMode, agent.DefaultMode,
		"What to do with a process over its memory cap, hidden from the hook, or in a pod of no slice: kill (stop it), report or off (always audited; the host's own processes are only reported)."))
	add(upTo100("enforce-tolerance", "PERCENT", &c.Agent.Enforcement.TolerancePercent, 5, "percent",
		"Percent above its memory cap a slice may go before it counts as over."))
	add(modeFlag("enforce-compute", &c.EnforceComputeMode, agent.DefaultComputeMode,
		"What to do with a slice whose SM use stays over its compute ceiling for 10 samples or --enforce-samples, whichever is more: report, kill (stop its busiest process) or off; report by default, since the hook paces launches and one kernel over 200 ms can take an honest slice past its ceiling; --enforce=off turns this off too."))
	add(upTo100("enforce-compute-tolerance", "POINTS", &c.Agent.Enforcement.ComputeTolerancePoints, 10, "percentage points",
		"Percentage points of the GPU above its compute ceiling (computeLimitPercent) a slice's SM use, as NVML measures it, may go before it counts as over."))
	add(cliconfig.Flag{Name: "enforce-samples", Placeholder: "N", Value: cliconfig.Int(&c.Agent.Enforcement.Samples), Default: "3",
		Help: "Consecutive samples a violation must last before the agent acts.",
		Check: func() error {
			if c.Agent.Enforcement.Samples < 0 {
				return fmt.Errorf("must not be negative, got %d", c.Agent.Enforcement.Samples)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "enforce-orphan-grace", Placeholder: "DURATION", Value: cliconfig.Duration(&c.Agent.Enforcement.OrphanGrace), Default: "30s",
		Help: "How long a GPU process must be in no slice before the agent acts (pods the watcher has not seen yet)."})
	add(cliconfig.Flag{Name: "trust-usage-pids", Value: cliconfig.Bool(&c.Agent.TrustUsagePIDs),
		Help: "Also map processes outside pod cgroups to slices by the usage regions' pids (advisory; tests and bare metal only)."})
	add(cliconfig.Flag{Name: "metrics-addr", Placeholder: "ADDR", Value: cliconfig.String(&c.MetricsAddr), Default: ":9400",
		Help:  "Listen address of /metrics (Prometheus) and /healthz.",
		Check: func() error { return cliconfig.CheckHostPort(c.MetricsAddr) }})
	add(cliconfig.Flag{Name: "log-level", Placeholder: "LEVEL", Value: cliconfig.String(&c.LogLevel), Default: "info",
		Help: "Log level: debug, info, warn or error (JSON logs on stderr).",
		Check: func() error {
			if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
				return fmt.Errorf("must be one of debug, info, warn, error, got %q", c.LogLevel)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "check-config", Value: cliconfig.Bool(&c.CheckConfig),
		Help: "Validate the configuration, print every problem and exit."})
	add(cliconfig.Flag{Name: "connect", Value: cliconfig.Bool(&c.Connect),
		Help: "Like --check-config, and also contact Redis, the Kubernetes API server and NVML, printing whether each answered."})
	return t
}

// dns1123Label is a Kubernetes namespace name.
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// nonNegative is a duration flag that must not be negative.
func nonNegative(name string, p *time.Duration, def time.Duration, help string) cliconfig.Flag {
	return cliconfig.Flag{Name: name, Placeholder: "DURATION", Value: cliconfig.Duration(p), Default: def.String(), Help: help,
		Check: func() error {
			if *p < 0 {
				return fmt.Errorf("must not be negative, got %s", *p)
			}
			return nil
		}}
}

// modeFlag is an enforcement mode flag (report, kill or off) into p.
func modeFlag(name string, p *string, def agent.Mode, help string) cliconfig.Flag {
	return cliconfig.Flag{Name: name, Placeholder: "MODE", Value: cliconfig.String(p), Default: string(def), Help: help,
		Check: func() error {
			if !agent.Mode(*p).Valid() {
				return fmt.Errorf("must be report, kill or off, got %q", *p)
			}
			return nil
		}}
}

// upTo100 is an int flag into p that must be 0..100 (in unit, as its
// error says).
func upTo100(name, placeholder string, p *int, def int, unit, help string) cliconfig.Flag {
	return cliconfig.Flag{Name: name, Placeholder: placeholder, Value: cliconfig.Int(p), Default: strconv.Itoa(def), Help: help,
		Check: func() error {
			if *p < 0 || *p > 100 {
				return fmt.Errorf("must be 0..100 %s, got %d", unit, *p)
			}
			return nil
		}}
}

// usage is the --help text: every flag with its env twin and default.
func usage() string {
	var c Config
	return c.table().Usage()
}

// Load parses args over environ (os.Environ()) over the defaults and
// validates the result. It returns cliconfig.ErrHelp or ErrVersion when
// args ask for them; otherwise the error joins every problem, one line each,
// and warnings name GPUBROKER_AGENT_ variables that no flag reads.
func Load(args, environ []string) (Config, []string, error) {
	var c Config
	warnings, err := c.table().Load(args, environ)
	c.Agent.Enforcement.Mode = agent.Mode(c.EnforceMode)
	c.Agent.Enforcement.ComputeMode = agent.Mode(c.EnforceComputeMode)
	return c, warnings, err
}
