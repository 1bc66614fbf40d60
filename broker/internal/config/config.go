package config

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

// MinLeaseDuration is the least --lease-duration: the shortest lease whose
// renew deadline leader.Timings can keep clear of a takeover (the app's
// tests check the two agree).
const MinLeaseDuration = 3 * time.Second

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

// Config is the whole configuration of the gpubroker binary, for both modes.
// Every field has a flag and a GPUBROKER_ environment variable (see Usage);
// Load fills it, Validate checks it. The zero value is not useful.
type Config struct {
	// Mode is serve or dev; main picks it from the subcommand.
	Mode Mode

	// Listen is the HTTP server's address, host:port. Default ":8080".
	Listen string
	// MetricsListen is the Prometheus /metrics listener's address,
	// host:port, separate from Listen; "" means none. Default ":9090" in
	// serve mode, "" in dev mode.
	MetricsListen string
	// DebugPprofListen is the address of the Go pprof listener
	// (/debug/pprof/), host:port; an empty host binds to 127.0.0.1; ""
	// (the default) means none.
	DebugPprofListen string
	// MetricsUserLabels adds per-user series (label user); off by default
	// for cardinality.
	MetricsUserLabels bool
	// PublicURL is the broker's external base URL (for redirects and links),
	// an absolute http(s) URL; "" means unknown. The web login needs it in
	// serve mode (its redirect URI is PublicURL/auth/callback); without it
	// the pages are off. Dev mode defaults it to the listen address.
	PublicURL string

	// NotebookMode is how the notebook proxy addresses notebooks: "host"
	// (each server on its own host under NotebookDomain; the serve default)
	// or "path" (all under PublicURL/user/...; the dev default). The proxy
	// is on whenever the web pages are.
	NotebookMode string
	// NotebookDomain is host mode's notebook domain: server pages at
	// <pod name>.<NotebookDomain>, with PublicURL's scheme and port (one
	// wildcard DNS record and certificate). Required in host mode with a
	// PublicURL.
	NotebookDomain string
	// NotebookAdminAccess lets admins open other users' notebooks through
	// the proxy. Default false.
	NotebookAdminAccess bool

	// Redis is the Redis to use: a URL or a Sentinel pair, a password file
	// and the key prefix (default "gpubroker:"). Required in serve mode; in
	// dev mode none means an embedded Redis.
	Redis cliconfig.Redis
	// RedisWaitReplicas is how many Redis replicas must acknowledge a
	// placement (WAIT) before its pod is created; -1 (the default) means 1
	// with Sentinel and 0 with a URL (see WaitReplicas).
	RedisWaitReplicas int
	// RedisWaitTimeout bounds that wait; > 0. Default 1 s.
	RedisWaitTimeout time.Duration
	// RedisStreamConnections bounds the connections of the event streams'
	// own Redis pool (each waiting stream holds one); >= 1. Default 1000.
	RedisStreamConnections int
	// Kube is the Kubernetes API server: a kubeconfig, or "" for the
	// in-cluster config in serve mode and a simulated cluster in dev mode.
	Kube cliconfig.Kube
	// Namespace holds the notebook pods. Default "gpubroker-notebooks".
	Namespace string
	// PodResync is how often every cached pod is classified again, so that
	// deadlines fire without a pod update; at least 1 s. Default
	// spawner.DefaultResync (5 s).
	PodResync time.Duration

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
	// Connect asks main to validate the configuration, contact every
	// outside part and exit; it implies CheckConfig.
	Connect bool

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
	// LeaseDuration is how long the Lease is valid without renewal; at
	// least MinLeaseDuration. Default 15 s (client-go's and
	// kube-controller-manager's).
	LeaseDuration time.Duration
}

// WaitReplicas resolves RedisWaitReplicas: its value when >= 0, else 1
// with Sentinel (a failover promotes a replica, which must hold every
// placement a pod was created for) and 0 with a single Redis URL.
func (c Config) WaitReplicas() int {
	switch {
	case c.RedisWaitReplicas >= 0:
		return c.RedisWaitReplicas
	case c.Redis.SentinelMaster != "":
		return 1
	default:
		return 0
	}
}

// EnvName returns the environment variable of a flag: GPUBROKER_ followed by
// the flag's name in upper case with '-' turned into '_'.
func EnvName(flagName string) string {
	return (&cliconfig.Table{EnvPrefix: EnvPrefix}).EnvName(flagName)
}

// Load builds the configuration for mode from args (the flags after the
// subcommand) and environ (os.Environ()): each value comes from its flag,
// else from its GPUBROKER_ variable (an empty variable counts as unset),
// else from the default, and the result is validated (files are only
// stat-ed). It returns cliconfig.ErrHelp or cliconfig.ErrVersion when args
// ask for them. Otherwise the error joins every problem, one line each:
// unknown flags, values that do not parse (naming the form they want), in
// flags or variables, and every failed check. Warnings name GPUBROKER_
// variables that no flag reads, with the closest one.
func Load(mode Mode, args, environ []string) (Config, []string, error) {
	if mode != ModeServe && mode != ModeDev {
		return Config{}, nil, fmt.Errorf("unknown mode %q: want %q or %q", mode, ModeServe, ModeDev)
	}
	c := Config{Mode: mode}
	warnings, err := c.Table().Load(args, environ)
	return c, warnings, err
}

// Validate reports every problem with c at once (errors.Join, one line
// each, naming the flag and its variable). It changes nothing; it reads only
// file metadata, to check that configured files exist and are regular files.
func (c Config) Validate() error { return c.Table().Validate() }

// Usage returns the help text for mode: every flag with its environment
// variable and default.
func Usage(mode Mode) string {
	c := Config{Mode: mode}
	return c.Table().Usage()
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

// LogValue logs the configuration: the mode and every flag of its table,
// the Redis URL's password hidden. Secrets are never in Config (only the
// paths of the files that hold them).
func (c Config) LogValue() slog.Value {
	attrs := append([]slog.Attr{slog.String("mode", string(c.Mode))}, c.Table().LogValue().Group()...)
	return slog.GroupValue(attrs...)
}

// HubToken reads HubTokenFile; it returns "" and no error when the file is
// not configured (hub access disabled).
func (c Config) HubToken() (cliconfig.Secret, error) {
	if c.HubTokenFile == "" {
		return "", nil
	}
	return cliconfig.ReadSecret(c.HubTokenFile)
}

// HubAPIToken reads HubAPITokenFile; it returns "" and no error when the
// file is not configured.
func (c Config) HubAPIToken() (cliconfig.Secret, error) {
	if c.HubAPITokenFile == "" {
		return "", nil
	}
	return cliconfig.ReadSecret(c.HubAPITokenFile)
}

// ClientSecret reads OIDCClientSecretFile; it returns "" and no error when
// the file is not configured (a public client).
func (c Config) ClientSecret() (cliconfig.Secret, error) {
	if c.OIDCClientSecretFile == "" {
		return "", nil
	}
	return cliconfig.ReadSecret(c.OIDCClientSecretFile)
}

// ClientID is the web login's client id: OIDCClientID, else OIDCAudience.
func (c Config) ClientID() string {
	if c.OIDCClientID != "" {
		return c.OIDCClientID
	}
	return c.OIDCAudience
}
