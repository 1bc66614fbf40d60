package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// EnvPrefix starts the name of every environment variable that Load reads.
const EnvPrefix = "GPUBROKER_"

// Mode is the gpubroker subcommand the configuration is for.
type Mode string

// The modes.
const (
	// ModeServe runs against a real Redis, Kubernetes and OIDC issuer.
	ModeServe Mode = "serve"
	// ModeDev runs the whole path in one process; Redis, the cluster, the
	// OIDC issuer and the profiles file are embedded unless configured.
	ModeDev Mode = "dev"
)

// GPUExposure is how a notebook pod is given its GPU.
type GPUExposure string

// The GPU exposure strategies.
const (
	// ExposureNVIDIARuntime sets NVIDIA_VISIBLE_DEVICES=<uuid> and the
	// runtime class (RuntimeClass).
	ExposureNVIDIARuntime GPUExposure = "nvidia-runtime"
	// ExposureCDI names the device in a CDI annotation.
	ExposureCDI GPUExposure = "cdi"
)

// Log levels and formats that Validate accepts.
var (
	logLevels  = []string{"debug", "info", "warn", "error"}
	logFormats = []string{"json", "text"}
)

// Config is the whole configuration of the gpubroker binary, for both modes.
// Every field has a flag and a GPUBROKER_ environment variable (see Usage);
// Load fills it, Validate checks it. The zero value is not useful.
type Config struct {
	// Mode is serve or dev; main picks it from the subcommand.
	Mode Mode

	// Listen is the HTTP server's address, host:port. Default ":8080".
	Listen string
	// PublicURL is the broker's external base URL (for redirects and links),
	// an absolute http(s) URL; "" means unknown. The web login needs it in
	// serve mode (its redirect URI is PublicURL/auth/callback); without it
	// the pages are off. Dev mode defaults it to the listen address.
	PublicURL string

	// RedisURL is redis://[user:password@]host:port[/db] or rediss:// for
	// TLS. Either it or the sentinel pair is required in serve mode; in dev
	// mode all empty means an embedded Redis.
	RedisURL string
	// RedisSentinelMaster is the Sentinel master name; with
	// RedisSentinelAddrs, an alternative to RedisURL.
	RedisSentinelMaster string
	// RedisSentinelAddrs are the Sentinels' host:port addresses.
	RedisSentinelAddrs []string
	// RedisPasswordFile is a file holding the Redis password; "" means none
	// (or the one in RedisURL). A trailing newline is ignored.
	RedisPasswordFile string
	// RedisPrefix starts every Redis key. Default "gpubroker:".
	RedisPrefix string

	// Kubeconfig is a kubeconfig path; "" means in-cluster config in serve
	// mode and a simulated cluster in dev mode.
	Kubeconfig string
	// Namespace holds the notebook pods. Default "gpubroker-notebooks".
	Namespace string

	// OIDCIssuer is the issuer URL. Required in serve mode; "" in dev mode
	// means the embedded dev issuer.
	OIDCIssuer string
	// OIDCAudience is the audience (client id) tokens must carry. Required in
	// serve mode and whenever OIDCIssuer is set.
	OIDCAudience string
	// OIDCUsernameClaim names the user-name claim. Default "preferred_username".
	OIDCUsernameClaim string
	// OIDCGroupsClaim names the groups claim. Default "groups".
	OIDCGroupsClaim string
	// AdminGroup is the group whose members are admins; "" means nobody.
	// Default "gpubroker-admins".
	AdminGroup string
	// HubTokenFile holds JupyterHub's service token; "" disables hub access.
	HubTokenFile string
	// OIDCClientID is the broker's client id for the web login; "" means
	// OIDCAudience.
	OIDCClientID string
	// OIDCClientSecretFile holds the web login's client secret; "" means a
	// public client (PKCE only).
	OIDCClientSecretFile string
	// SessionTTL is a web session's absolute lifetime; > 0. Default 12 h.
	SessionTTL time.Duration

	// ProfilesFile is the profiles-and-quotas YAML file. Required in serve
	// mode; "" in dev mode means the embedded catalog.
	ProfilesFile string
	// PlacementPolicy is binpack (default) or spread.
	PlacementPolicy fleet.Policy

	// HostRoot is the node directory holding the hook and the slices' quota
	// and usage files; absolute. Default "/var/lib/gpubroker".
	HostRoot string
	// GPUExposure is nvidia-runtime (default) or cdi.
	GPUExposure GPUExposure
	// RuntimeClass is the pods' runtimeClassName; "" means the cluster's
	// default runtime. Default "nvidia".
	RuntimeClass string

	// ReconcileInterval is the period of the pods-versus-Redis reconciler;
	// at least 1 s. Default 30 s.
	ReconcileInterval time.Duration
	// OrphanGrace is how long a managed pod without an allocation lives
	// before the reconciler deletes it; > 0. Default 2 min.
	OrphanGrace time.Duration
	// StartTimeout fails a spawn that is not running by then; > 0. Default 5 min.
	StartTimeout time.Duration
	// ShutdownTimeout bounds graceful shutdown; > 0. Default 20 s.
	ShutdownTimeout time.Duration

	// LogLevel is debug, info (default), warn or error.
	LogLevel string
	// LogFormat is json or text; default json in serve mode, text in dev mode.
	LogFormat string
	// CheckConfig asks main to validate the configuration and exit.
	CheckConfig bool

	// ReclaimInterval is the period of the idle reclaimer's cycle; at least
	// 5 s. Default 30 s.
	ReclaimInterval time.Duration
	// HubURL is JupyterHub's base URL (e.g. http://hub:8081/) for posting
	// the activity of GPU-busy servers; "" disables posting.
	HubURL string
	// HubAPITokenFile holds a hub API token with the users:activity scope;
	// required with HubURL.
	HubAPITokenFile string
	// LeaderElectionNamespace is the namespace of the Lease that elects the
	// replica running the reclaimer; "" runs the reclaimer without a Lease
	// (a single replica only).
	LeaderElectionNamespace string
	// LeaseName is that Lease's name. Default "gpubroker-reclaimer".
	LeaseName string

	// DevGPUs is the number of simulated H200 GPUs in dev mode, 1..64.
	// Default 8. Ignored in serve mode.
	DevGPUs int
}

// flagSpec describes one flag: its name, a placeholder for its value in
// Usage, its help text, and an optional note replacing the default in Usage.
type flagSpec struct {
	name, value, help, defaultNote string
}

// specs lists every flag in Usage order. register binds them.
var specs = []flagSpec{
	{"listen", "ADDR", "Address the HTTP server listens on, host:port.", ""},
	{"public-url", "URL", "External base URL of the broker, for links and login redirects.", ""},
	{"redis-url", "URL", "Redis to use: redis://[user:password@]host:port[/db], or rediss:// for TLS.", "none; required in serve mode unless Sentinel is set, embedded in dev mode"},
	{"redis-sentinel-master", "NAME", "Redis Sentinel master name (alternative to --redis-url).", ""},
	{"redis-sentinel-addrs", "LIST", "Comma-separated Redis Sentinel addresses, host:port.", ""},
	{"redis-password-file", "PATH", "File holding the Redis password.", ""},
	{"redis-prefix", "PREFIX", "Prefix of every Redis key.", ""},
	{"kubeconfig", "PATH", "Kubeconfig file.", "none: in-cluster config in serve mode, a simulated cluster in dev mode"},
	{"namespace", "NAME", "Namespace of the notebook pods.", ""},
	{"oidc-issuer", "URL", "OIDC issuer URL whose tokens callers send.", "none; required in serve mode, the embedded dev issuer in dev mode"},
	{"oidc-audience", "AUD", "Audience (client id) that tokens must carry.", "none; required with --oidc-issuer (the embedded dev issuer uses gpubroker)"},
	{"oidc-username-claim", "CLAIM", "Token claim holding the user name.", ""},
	{"oidc-groups-claim", "CLAIM", "Token claim holding the user's groups.", ""},
	{"admin-group", "GROUP", "Group whose members are admins; empty: nobody.", ""},
	{"hub-token-file", "PATH", "File holding the JupyterHub service token; empty disables hub access.", ""},
	{"oidc-client-id", "ID", "Client id of the web login at the OIDC issuer.", "the --oidc-audience"},
	{"oidc-client-secret-file", "PATH", "File holding the web login's client secret; empty: a public client (PKCE only).", ""},
	{"session-ttl", "DURATION", "Absolute lifetime of a web session.", ""},
	{"profiles-file", "PATH", "Profiles-and-quotas YAML file.", "none; required in serve mode, the embedded catalog in dev mode"},
	{"placement-policy", "POLICY", "Slice placement policy: binpack or spread.", ""},
	{"host-root", "PATH", "Node directory for the limiter hook and the slices' quota and usage files.", ""},
	{"gpu-exposure", "HOW", "How pods get their GPU: nvidia-runtime or cdi.", ""},
	{"runtime-class", "NAME", "runtimeClassName of notebook pods; empty: the cluster default.", ""},
	{"reconcile-interval", "DURATION", "Period of the pods-versus-Redis reconciler (at least 1s).", ""},
	{"orphan-grace", "DURATION", "How long a managed pod without an allocation lives before it is deleted.", ""},
	{"start-timeout", "DURATION", "A spawn not running after this fails.", ""},
	{"shutdown-timeout", "DURATION", "Time allowed for graceful shutdown.", ""},
	{"reclaim-interval", "DURATION", "Period of the idle reclaimer (at least 5s).", ""},
	{"hub-url", "URL", "JupyterHub base URL; with --hub-api-token-file the broker posts activity of GPU-busy servers so the hub's culler keeps them.", ""},
	{"hub-api-token-file", "PATH", "File holding a hub API token with the users:activity scope.", ""},
	{"leader-election-namespace", "NAME", "Namespace of the Lease electing the replica that runs the reclaimer; empty: no election (one replica only).", ""},
	{"lease-name", "NAME", "Name of that Lease.", ""},
	{"log-level", "LEVEL", "Log level: debug, info, warn or error.", ""},
	{"log-format", "FORMAT", "Log format: json or text.", "json in serve mode, text in dev mode"},
	{"check-config", "", "Validate the configuration, print the problems and exit.", ""},
	{"dev-gpus", "N", "Number of simulated H200 GPUs in dev mode, 1..64.", ""},
}

// register binds every flag of specs to a field of c, with its default.
func register(fs *flag.FlagSet, c *Config) {
	str := func(p *string, name, def string) { fs.StringVar(p, name, def, "") }
	str(&c.Listen, "listen", ":8080")
	str(&c.PublicURL, "public-url", "")
	str(&c.RedisURL, "redis-url", "")
	str(&c.RedisSentinelMaster, "redis-sentinel-master", "")
	fs.Var((*listValue)(&c.RedisSentinelAddrs), "redis-sentinel-addrs", "")
	str(&c.RedisPasswordFile, "redis-password-file", "")
	str(&c.RedisPrefix, "redis-prefix", "gpubroker:")
	str(&c.Kubeconfig, "kubeconfig", "")
	str(&c.Namespace, "namespace", "gpubroker-notebooks")
	str(&c.OIDCIssuer, "oidc-issuer", "")
	str(&c.OIDCAudience, "oidc-audience", "")
	str(&c.OIDCUsernameClaim, "oidc-username-claim", "preferred_username")
	str(&c.OIDCGroupsClaim, "oidc-groups-claim", "groups")
	str(&c.AdminGroup, "admin-group", "gpubroker-admins")
	str(&c.HubTokenFile, "hub-token-file", "")
	str(&c.OIDCClientID, "oidc-client-id", "")
	str(&c.OIDCClientSecretFile, "oidc-client-secret-file", "")
	fs.DurationVar(&c.SessionTTL, "session-ttl", 12*time.Hour, "")
	str(&c.ProfilesFile, "profiles-file", "")
	str((*string)(&c.PlacementPolicy), "placement-policy", string(fleet.PolicyBinpack))
	str(&c.HostRoot, "host-root", "/var/lib/gpubroker")
	str((*string)(&c.GPUExposure), "gpu-exposure", string(ExposureNVIDIARuntime))
	str(&c.RuntimeClass, "runtime-class", "nvidia")
	fs.DurationVar(&c.ReconcileInterval, "reconcile-interval", 30*time.Second, "")
	fs.DurationVar(&c.OrphanGrace, "orphan-grace", 2*time.Minute, "")
	fs.DurationVar(&c.StartTimeout, "start-timeout", 5*time.Minute, "")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 20*time.Second, "")
	fs.DurationVar(&c.ReclaimInterval, "reclaim-interval", 30*time.Second, "")
	str(&c.HubURL, "hub-url", "")
	str(&c.HubAPITokenFile, "hub-api-token-file", "")
	str(&c.LeaderElectionNamespace, "leader-election-namespace", "")
	str(&c.LeaseName, "lease-name", "gpubroker-reclaimer")
	str(&c.LogLevel, "log-level", "info")
	str(&c.LogFormat, "log-format", "")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "")
	fs.IntVar(&c.DevGPUs, "dev-gpus", 8, "")
}

// listValue is a comma-separated list flag. Set replaces the list; empty
// items are dropped.
type listValue []string

func (l *listValue) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *listValue) Set(s string) error {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	*l = out
	return nil
}

// EnvName returns the environment variable of a flag: GPUBROKER_ followed by
// the flag's name in upper case with '-' turned into '_'.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Load builds the configuration for mode from args (the flags after the
// subcommand) and the environment. Each value comes from its flag, else from
// its GPUBROKER_ variable (an empty variable counts as unset), else from the
// default. Load does not validate (see Validate) and reads no files.
//
// For -h or --help it writes Usage(mode) to help (when not nil) and returns
// flag.ErrHelp: exit 0. Other errors (unknown mode or flag, stray arguments,
// unparsable values in flags or variables) are joined, one line each.
func Load(mode Mode, args []string, getenv func(string) string, help io.Writer) (Config, error) {
	c := Config{Mode: mode}
	if mode != ModeServe && mode != ModeDev {
		return Config{}, fmt.Errorf("config: unknown mode %q: want %q or %q", mode, ModeServe, ModeDev)
	}
	fs := flag.NewFlagSet("gpubroker "+string(mode), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	register(fs, &c)

	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(f.Name)
		v := getenv(env)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("config: %s=%q: %w", env, v, err))
		}
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if help != nil {
				// A failed write of the help text leaves nothing to report.
				_, _ = io.WriteString(help, Usage(mode))
			}
			return c, flag.ErrHelp
		}
		errs = append(errs, fmt.Errorf("config: %w (see gpubroker %s --help)", err, c.Mode))
	} else if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("config: unexpected arguments %q (see gpubroker %s --help)", fs.Args(), c.Mode))
	}
	if c.LogFormat == "" {
		c.LogFormat = "json"
		if c.Mode == ModeDev {
			c.LogFormat = "text"
		}
	}
	return c, errors.Join(errs...)
}

// Usage returns the help text for mode: every flag with its environment
// variable and default.
func Usage(mode Mode) string {
	var c Config
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	register(fs, &c)
	var b strings.Builder
	switch mode {
	case ModeDev:
		fmt.Fprintf(&b, "Usage: gpubroker dev [flags]\n\nRuns the whole path in one process: an embedded Redis, OIDC issuer, profiles\nand simulated GPUs and cluster, unless the flags below name real ones.\n")
	default:
		fmt.Fprintf(&b, "Usage: gpubroker serve [flags]\n\nRuns the broker against a real Redis, Kubernetes API server and OIDC issuer.\n")
	}
	fmt.Fprintf(&b, "\nEvery flag can also be set by the environment variable shown; a flag beats\nits variable, which beats the default. Durations look like 30s, 2m, 1h.\n\nFlags:\n")
	for _, s := range specs {
		f := fs.Lookup(s.name)
		head := "  --" + s.name
		if s.value != "" {
			head += " " + s.value
		}
		def := s.defaultNote
		switch {
		case def != "":
		case s.value == "": // a bool
			def = f.DefValue
		case f.DefValue == "":
			def = "none"
		default:
			def = fmt.Sprintf("%q", f.DefValue)
		}
		fmt.Fprintf(&b, "%s\n      %s\n      env %s, default %s\n", head, s.help, EnvName(s.name), def)
	}
	return b.String()
}

// Logger returns the logger that Config asks for, writing to w: JSON or
// text, at LogLevel (info if it does not parse).
func (c Config) Logger(w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// LogValue logs the configuration. It holds no secrets (only the paths of
// the files that do), so every field is shown.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("mode", string(c.Mode)),
		slog.String("listen", c.Listen),
		slog.String("public_url", c.PublicURL),
		slog.String("redis_url", redactURL(c.RedisURL)),
		slog.String("redis_sentinel_master", c.RedisSentinelMaster),
		slog.Any("redis_sentinel_addrs", c.RedisSentinelAddrs),
		slog.String("redis_password_file", c.RedisPasswordFile),
		slog.String("redis_prefix", c.RedisPrefix),
		slog.String("kubeconfig", c.Kubeconfig),
		slog.String("namespace", c.Namespace),
		slog.String("oidc_issuer", c.OIDCIssuer),
		slog.String("oidc_audience", c.OIDCAudience),
		slog.String("oidc_username_claim", c.OIDCUsernameClaim),
		slog.String("oidc_groups_claim", c.OIDCGroupsClaim),
		slog.String("admin_group", c.AdminGroup),
		slog.String("hub_token_file", c.HubTokenFile),
		slog.String("oidc_client_id", c.OIDCClientID),
		slog.String("oidc_client_secret_file", c.OIDCClientSecretFile),
		slog.Duration("session_ttl", c.SessionTTL),
		slog.String("profiles_file", c.ProfilesFile),
		slog.String("placement_policy", string(c.PlacementPolicy)),
		slog.String("host_root", c.HostRoot),
		slog.String("gpu_exposure", string(c.GPUExposure)),
		slog.String("runtime_class", c.RuntimeClass),
		slog.Duration("reconcile_interval", c.ReconcileInterval),
		slog.Duration("orphan_grace", c.OrphanGrace),
		slog.Duration("start_timeout", c.StartTimeout),
		slog.Duration("shutdown_timeout", c.ShutdownTimeout),
		slog.Duration("reclaim_interval", c.ReclaimInterval),
		slog.String("hub_url", c.HubURL),
		slog.String("hub_api_token_file", c.HubAPITokenFile),
		slog.String("leader_election_namespace", c.LeaderElectionNamespace),
		slog.String("lease_name", c.LeaseName),
		slog.String("log_level", c.LogLevel),
		slog.String("log_format", c.LogFormat),
		slog.Int("dev_gpus", c.DevGPUs),
	)
}

// Secret is a credential read from a file. It prints and logs as REDACTED;
// Reveal returns the value.
type Secret string

// Redacted is what a Secret prints as.
const Redacted = "REDACTED"

// Reveal returns the secret value.
func (s Secret) Reveal() string { return string(s) }

// String returns Redacted, so fmt never prints the value.
func (s Secret) String() string { return Redacted }

// GoString returns Redacted, for %#v.
func (s Secret) GoString() string { return Redacted }

// LogValue returns Redacted, so slog never prints the value.
func (s Secret) LogValue() slog.Value { return slog.StringValue(Redacted) }

// ReadSecret reads a secret file; trailing newlines are dropped. An empty
// file is an error.
func ReadSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("config: read secret: %w", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("config: secret file %s is empty", path)
	}
	return Secret(s), nil
}

// HubToken reads HubTokenFile; it returns "" and no error when the file is
// not configured (hub access disabled).
func (c Config) HubToken() (Secret, error) {
	if c.HubTokenFile == "" {
		return "", nil
	}
	return ReadSecret(c.HubTokenFile)
}

// HubAPIToken reads HubAPITokenFile; it returns "" and no error when the
// file is not configured.
func (c Config) HubAPIToken() (Secret, error) {
	if c.HubAPITokenFile == "" {
		return "", nil
	}
	return ReadSecret(c.HubAPITokenFile)
}

// ClientSecret reads OIDCClientSecretFile; it returns "" and no error when
// the file is not configured (a public client).
func (c Config) ClientSecret() (Secret, error) {
	if c.OIDCClientSecretFile == "" {
		return "", nil
	}
	return ReadSecret(c.OIDCClientSecretFile)
}

// ClientID is the web login's client id: OIDCClientID, else OIDCAudience.
func (c Config) ClientID() string {
	if c.OIDCClientID != "" {
		return c.OIDCClientID
	}
	return c.OIDCAudience
}
