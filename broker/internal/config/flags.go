package config

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
	"github.com/gpubroker/gpubroker/spawner"
)

// Table returns the flag table of c's mode bound to c: every setting with
// its variable, default, help and check. Loading it fills c; its Validate,
// Usage, LogValue and Markdown are this package's.
func (c *Config) Table() *cliconfig.Table {
	serve := c.Mode == ModeServe
	requiredInServe := func() error {
		if serve {
			return errors.New("is required in serve mode")
		}
		return nil
	}
	// What stands in for a setting left empty, per mode.
	logFormat, metricsListen, notebookMode := "json", ":9090", "host"
	summary := "Runs the broker against a real Redis, Kubernetes API server and OIDC issuer."
	noRedis, noKube, noIssuer, noAudience, noProfiles := "none; required unless Sentinel is set", "none: the in-cluster config",
		"none; required", "none; required", "none; required"
	if c.Mode == ModeDev {
		logFormat, metricsListen, notebookMode = "text", "", "path"
		summary = "Runs the whole path in one process: an embedded Redis, OIDC issuer, profiles\nand simulated GPUs and cluster, unless the flags below name real ones."
		noRedis, noKube, noIssuer, noAudience, noProfiles = "none: an embedded Redis", "none: a simulated cluster",
			"none: an embedded issuer", "none; required with --oidc-issuer (the embedded issuer uses gpubroker)", "none: the embedded profiles"
	}
	t := &cliconfig.Table{
		Program:   "gpubroker " + string(c.Mode),
		Summary:   summary,
		EnvPrefix: EnvPrefix,
		Foreign:   foreignEnv,
		Checks: []func() error{func() error {
			if c.Mode != ModeServe && c.Mode != ModeDev {
				return fmt.Errorf("mode %q is neither %q nor %q", c.Mode, ModeServe, ModeDev)
			}
			return nil
		}},
	}
	add := func(fs ...cliconfig.Flag) { t.Flags = append(t.Flags, fs...) }

	add(cliconfig.Flag{Name: "listen", Placeholder: "ADDR", Value: cliconfig.String(&c.Listen), Default: ":8080",
		Help:  "Address the HTTP server listens on, host:port.",
		Check: func() error { return cliconfig.CheckHostPort(c.Listen) }})
	add(cliconfig.Flag{Name: "metrics-listen", Placeholder: "ADDR", Value: cliconfig.String(&c.MetricsListen), Default: metricsListen,
		Help:  "Address of the Prometheus /metrics listener, host:port, apart from the API so that it is never exposed with it; empty: no metrics listener.",
		Check: func() error { return optional(c.MetricsListen, cliconfig.CheckHostPort) }})
	add(cliconfig.Flag{Name: "debug-pprof-listen", Placeholder: "ADDR", Value: cliconfig.String(&c.DebugPprofListen),
		Help:  "Address of a Go pprof listener (/debug/pprof/), host:port, for profiling the broker; an empty host binds to loopback (127.0.0.1); empty: none (the default). An admin tool: never expose it.",
		Check: func() error { return optional(c.DebugPprofListen, cliconfig.CheckHostPort) }})
	add(cliconfig.Flag{Name: "metrics-user-labels", Value: cliconfig.Bool(&c.MetricsUserLabels),
		Help: "Also export per-user series (servers and allocated GPU memory and compute by user name); off by default, since every user adds series."})
	add(cliconfig.Flag{Name: "public-url", Placeholder: "URL", Value: cliconfig.String(&c.PublicURL),
		Help:  "External base URL of the broker, for links and login redirects; the web pages are on only with it in serve mode.",
		Check: func() error { return optional(c.PublicURL, checkHTTPURL) }})
	add(oneOf("notebook-mode", "MODE", &c.NotebookMode, notebookMode, []string{"host", "path"},
		"How the broker serves notebooks to their owners: host (each server on its own host name under --notebook-domain, so notebooks never share a browser origin) or path (all under <public-url>/user/...: one origin for every notebook and the broker's pages; see the README)."))
	add(cliconfig.Flag{Name: "notebook-domain", Placeholder: "DOMAIN", Value: cliconfig.String(&c.NotebookDomain),
		Help: "Host mode's notebook domain: a server is served at <pod name>.<domain> with the public URL's scheme and port, behind one wildcard DNS record and certificate (*.<domain>); required in host mode with --public-url.",
		Check: func() error {
			d := strings.Trim(c.NotebookDomain, ".")
			switch {
			case d == "" && c.NotebookMode == "host" && c.PublicURL != "":
				return errors.New("is required with --notebook-mode=host and --public-url (or use --notebook-mode=path)")
			case d != "" && (len(d) > 253 || !dns1123Subdomain.MatchString(strings.ToLower(d))):
				return fmt.Errorf("%q is not a DNS name", c.NotebookDomain)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "notebook-admin-access", Value: cliconfig.Bool(&c.NotebookAdminAccess),
		Help: "Let admins open other users' notebooks through the proxy (off: only the owner)."})
	add(c.Redis.Flags(cliconfig.RedisRequirement{Required: serve, Why: " in serve mode", URLDefault: noRedis})...)
	add(cliconfig.Flag{Name: "redis-wait-replicas", Placeholder: "N", Value: cliconfig.Int(&c.RedisWaitReplicas), Default: "-1",
		DefaultDoc: "-1: 1 with Sentinel, 0 with --redis-url",
		Help:       "Redis replicas that must acknowledge a placement (WAIT) before its pod is created, so that a Sentinel failover never loses a slice a pod holds; 0 waits for none, -1 picks by the Redis setup.",
		Check:      cliconfig.AtLeast(&c.RedisWaitReplicas, -1)})
	add(cliconfig.Flag{Name: "redis-wait-timeout", Placeholder: "DURATION", Value: cliconfig.Duration(&c.RedisWaitTimeout), Default: "1s",
		Help: "How long a placement waits for --redis-wait-replicas acknowledgements before it is refused (and released) as not durable; 1ms..2s (below the Redis client's read timeout).",
		Check: func() error {
			if c.RedisWaitTimeout < time.Millisecond || c.RedisWaitTimeout > maxRedisWait {
				return fmt.Errorf("must be 1ms..%s, got %s", maxRedisWait, c.RedisWaitTimeout)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "redis-stream-connections", Placeholder: "N", Value: cliconfig.Int(&c.RedisStreamConnections), Default: "1000",
		Help:  "Most Redis connections the event streams of this replica hold at once, in a pool of their own (each waiting stream holds one, until a few seconds after its client left), so streams never delay placement.",
		Check: cliconfig.AtLeast(&c.RedisStreamConnections, 1)})
	add(c.Kube.Flags(cliconfig.KubeDefaults{Kubeconfig: noKube, QPS: KubeAPIQPS, Burst: KubeAPIBurst,
		Source: "kube-scheduler's and the kubelet's, the components on the pod-creation path"})...)
	add(durationFlag("pod-resync", &c.PodResync, spawnerResync, time.Second,
		"Period at which every cached notebook pod is judged again, so that deadlines such as --start-timeout fire without a new pod update; it reads the informer's cache, not the API server."))
	add(cliconfig.Flag{Name: "namespace", Placeholder: "NAME", Value: cliconfig.String(&c.Namespace), Default: "gpubroker-notebooks",
		Help: "Namespace of the notebook pods.",
		Check: func() error {
			if !dns1123Label.MatchString(c.Namespace) || len(c.Namespace) > 63 {
				return fmt.Errorf("%q is not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)", c.Namespace)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "oidc-issuer", Placeholder: "URL", Value: cliconfig.String(&c.OIDCIssuer),
		DefaultDoc: noIssuer,
		Help:       "OIDC issuer URL whose tokens callers send.",
		Check: func() error {
			if c.OIDCIssuer == "" {
				return requiredInServe()
			}
			return checkHTTPURL(c.OIDCIssuer)
		}})
	add(cliconfig.Flag{Name: "oidc-audience", Placeholder: "AUD", Value: cliconfig.String(&c.OIDCAudience),
		DefaultDoc: noAudience,
		Help:       "Audience (client id) that tokens must carry.",
		Check: func() error {
			if strings.TrimSpace(c.OIDCAudience) == "" && (serve || c.OIDCIssuer != "") {
				return errors.New("is required in serve mode and whenever --oidc-issuer is set")
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "oidc-username-claim", Placeholder: "CLAIM", Value: cliconfig.String(&c.OIDCUsernameClaim), Default: "preferred_username",
		Help: "Token claim holding the user name.", Check: notBlank(&c.OIDCUsernameClaim)})
	add(cliconfig.Flag{Name: "oidc-groups-claim", Placeholder: "CLAIM", Value: cliconfig.String(&c.OIDCGroupsClaim), Default: "groups",
		Help: "Token claim holding the user's groups.", Check: notBlank(&c.OIDCGroupsClaim)})
	add(cliconfig.Flag{Name: "admin-group", Placeholder: "GROUP", Value: cliconfig.String(&c.AdminGroup), Default: "gpubroker-admins",
		Help: "Group whose members are admins; empty: nobody."})
	add(cliconfig.Flag{Name: "hub-token-file", Placeholder: "PATH", Value: cliconfig.String(&c.HubTokenFile),
		Help:  "File holding the JupyterHub service token; empty disables hub access.",
		Check: func() error { return optional(c.HubTokenFile, cliconfig.CheckFile) }})
	add(cliconfig.Flag{Name: "oidc-client-id", Placeholder: "ID", Value: cliconfig.String(&c.OIDCClientID), DefaultDoc: "the --oidc-audience",
		Help: "Client id of the web login at the OIDC issuer."})
	add(cliconfig.Flag{Name: "oidc-client-secret-file", Placeholder: "PATH", Value: cliconfig.String(&c.OIDCClientSecretFile),
		Help:  "File holding the web login's client secret; empty: a public client (PKCE only).",
		Check: func() error { return optional(c.OIDCClientSecretFile, cliconfig.CheckFile) }})
	add(durationFlag("session-ttl", &c.SessionTTL, "12h", time.Minute, "Absolute lifetime of a web session (at least 1m)."))
	add(cliconfig.Flag{Name: "profiles-file", Placeholder: "PATH", Value: cliconfig.String(&c.ProfilesFile),
		DefaultDoc: noProfiles,
		Help:       "Profiles-and-quotas YAML file.",
		Check: func() error {
			if c.ProfilesFile == "" {
				return requiredInServe()
			}
			return cliconfig.CheckFile(c.ProfilesFile)
		}})
	add(cliconfig.Flag{Name: "placement-policy", Placeholder: "POLICY", Value: cliconfig.String((*string)(&c.PlacementPolicy)), Default: string(fleet.PolicyBinpack),
		Help: "Slice placement policy: binpack or spread.",
		Check: func() error {
			if !c.PlacementPolicy.Valid() {
				return fmt.Errorf("must be binpack or spread, got %q", c.PlacementPolicy)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "host-root", Placeholder: "PATH", Value: cliconfig.String(&c.HostRoot), Default: "/var/lib/gpubroker",
		Help: "Node directory for the limiter hook and the slices' quota and usage files.",
		Check: func() error {
			if !filepath.IsAbs(c.HostRoot) {
				return fmt.Errorf("must be an absolute path, got %q", c.HostRoot)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "gpu-exposure", Placeholder: "HOW", Value: cliconfig.String((*string)(&c.GPUExposure)), Default: string(ExposureNVIDIARuntime),
		Help: "How pods get their GPU: nvidia-runtime (NVIDIA_VISIBLE_DEVICES) or cdi.",
		Check: func() error {
			if c.GPUExposure != ExposureNVIDIARuntime && c.GPUExposure != ExposureCDI {
				return fmt.Errorf("must be %s or %s, got %q", ExposureNVIDIARuntime, ExposureCDI, c.GPUExposure)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "runtime-class", Placeholder: "NAME", Value: cliconfig.String(&c.RuntimeClass), Default: "nvidia",
		Help: "runtimeClassName of notebook pods; empty: the cluster default.",
		Check: func() error {
			if c.RuntimeClass != "" && (len(c.RuntimeClass) > 253 || !dns1123Subdomain.MatchString(c.RuntimeClass)) {
				return fmt.Errorf("%q is not a Kubernetes object name (lowercase DNS subdomain)", c.RuntimeClass)
			}
			return nil
		}})
	add(durationFlag("reconcile-interval", &c.ReconcileInterval, "30s", time.Second, "Period of the pods-versus-Redis reconciler (at least 1s)."))
	add(durationFlag("orphan-grace", &c.OrphanGrace, "2m", time.Nanosecond, "Quiet time before a record or pod counts as abandoned."))
	add(durationFlag("start-timeout", &c.StartTimeout, "5m", time.Nanosecond, "A spawn not running after this fails."))
	add(durationFlag("shutdown-timeout", &c.ShutdownTimeout, "20s", time.Nanosecond, "Time allowed for graceful shutdown."))
	add(durationFlag("reclaim-interval", &c.ReclaimInterval, "30s", 5*time.Second, "Period of the idle reclaimer (at least 5s)."))
	add(cliconfig.Flag{Name: "hub-url", Placeholder: "URL", Value: cliconfig.String(&c.HubURL),
		Help: "JupyterHub base URL; with --hub-api-token-file the broker posts activity of GPU-busy servers so the hub's culler keeps them.",
		Check: func() error {
			if c.HubURL == "" {
				if c.HubAPITokenFile != "" {
					return errors.New("is required with --hub-api-token-file")
				}
				return nil
			}
			if u, err := url.Parse(c.HubURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("must be an http(s) URL, got %q", c.HubURL)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "hub-api-token-file", Placeholder: "PATH", Value: cliconfig.String(&c.HubAPITokenFile),
		Help: "File holding a hub API token (scope users:activity); required with --hub-url.",
		Check: func() error {
			if c.HubURL != "" && c.HubAPITokenFile == "" {
				return errors.New("is required with --hub-url")
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "leader-election-namespace", Placeholder: "NAME", Value: cliconfig.String(&c.LeaderElectionNamespace),
		Help: "Namespace of the Lease electing the replica that runs the reclaimer and the periodic reconcile passes; empty: no election (run one replica only).",
		Check: func() error {
			if c.LeaderElectionNamespace != "" && !dns1123Label.MatchString(c.LeaderElectionNamespace) {
				return fmt.Errorf("%q is not a namespace name", c.LeaderElectionNamespace)
			}
			return nil
		}})
	add(cliconfig.Flag{Name: "lease-name", Placeholder: "NAME", Value: cliconfig.String(&c.LeaseName), Default: "gpubroker-reclaimer",
		Help: "Name of that Lease.",
		Check: func() error {
			if c.LeaseName == "" || len(c.LeaseName) > 253 || !dns1123Subdomain.MatchString(c.LeaseName) {
				return fmt.Errorf("%q is not a Kubernetes object name (lowercase DNS subdomain)", c.LeaseName)
			}
			return nil
		}})
	add(durationFlag("lease-duration", &c.LeaseDuration, "15s", MinLeaseDuration,
		"How long the Lease (held by the replica that runs the reclaimer and the periodic reconcile passes) stays valid without renewal (client-go leaderelection); the holder tries to renew it every 2/15 of it and stops leading when it could not for two thirds of it (less for leases under 15s, so that a holder cut off from the API server stops before another can take over), others retry every 2/15 of it, so a crashed holder is replaced within about this time."))
	add(oneOf("log-level", "LEVEL", &c.LogLevel, "info", logLevels, "Log level: debug, info, warn or error."))
	add(oneOf("log-format", "FORMAT", &c.LogFormat, logFormat, logFormats, "Log format: json or text."))
	add(cliconfig.Flag{Name: "check-config", Value: cliconfig.Bool(&c.CheckConfig),
		Help: "Validate the configuration (the profiles file included), print every problem and exit."})
	add(cliconfig.Flag{Name: "connect", Value: cliconfig.Bool(&c.Connect),
		Help: "Like --check-config, and also contact Redis, the OIDC issuer and the Kubernetes API server, printing whether each answered."})
	return t
}

// The broker's Kubernetes client rate limit: the defaults of kube-scheduler
// (KubeSchedulerConfiguration clientConnection qps 50, burst 100) and of the
// kubelet since v1.27 (kubeAPIQPS 50, kubeAPIBurst 100), the components
// that create and bind pods; kube-controller-manager uses 20 and 30.
// client-go's own 5 and 10 made every spawn beyond the tenth in a burst wait
// for a token (5 spawns per second in `go tool task bench:spawn`).
const (
	KubeAPIQPS   = 50
	KubeAPIBurst = 100
)

// maxRedisWait bounds --redis-wait-timeout below the Redis client's read
// timeout (cliconfig.RedisReadTimeout), which also bounds the WAIT's reply.
const maxRedisWait = cliconfig.RedisReadTimeout - time.Second

// spawnerResync is --pod-resync's default, spawner.DefaultResync.
var spawnerResync = spawner.DefaultResync.String()

// foreignEnv are GPUBROKER_* variables of other programs: the node agent's
// flags (GPUBROKER_AGENT_*), the test helpers' and the stub driver's, the
// in-pod hook's log level and the notebook pod's own environment (a broker
// run as the pod runner's child inherits them). The hook reads no other
// variable: its slice comes from the fixed in-pod files only.
// (The last three are broker/api/v1's EnvLogLevel, EnvPodIP and
// EnvBaseURL, spelled out: this package does not import the wire types.)
var foreignEnv = []string{"GPUBROKER_AGENT_", "GPUBROKER_TEST_", "GPUBROKER_STUB_",
	"GPUBROKER_LIMITER_LOG", "GPUBROKER_POD_IP", "GPUBROKER_BASE_URL"}

// durationFlag is a duration flag that must be at least least (time.Nanosecond: > 0).
func durationFlag(name string, p *time.Duration, def string, least time.Duration, help string) cliconfig.Flag {
	return cliconfig.Flag{Name: name, Placeholder: "DURATION", Value: cliconfig.Duration(p), Default: def, Help: help,
		Check: func() error {
			switch {
			case *p >= least:
				return nil
			case least == time.Nanosecond:
				return fmt.Errorf("must be > 0, got %s", *p)
			default:
				return fmt.Errorf("must be at least %s, got %s", least, *p)
			}
		}}
}

// oneOf is a text flag whose value must be one of allowed.
func oneOf(name, placeholder string, p *string, def string, allowed []string, help string) cliconfig.Flag {
	return cliconfig.Flag{Name: name, Placeholder: placeholder, Value: cliconfig.String(p), Default: def, Help: help,
		Check: func() error {
			if !slices.Contains(allowed, *p) {
				return fmt.Errorf("must be one of %s, got %q", strings.Join(allowed, ", "), *p)
			}
			return nil
		}}
}

func notBlank(p *string) func() error {
	return func() error {
		if strings.TrimSpace(*p) == "" {
			return errors.New("is empty")
		}
		return nil
	}
}

func optional(v string, check func(string) error) error {
	if v == "" {
		return nil
	}
	return check(v)
}
