package config_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

// serveBasics are what serve mode requires (a Redis, an issuer and its
// audience, a profiles file that exists), as variables, for tests about
// other settings; withBasics sets the same on a Config.
func serveBasics(profiles string) map[string]string {
	return map[string]string{
		"GPUBROKER_REDIS_URL": "redis://127.0.0.1:6390/0", "GPUBROKER_OIDC_ISSUER": "https://idp.example",
		"GPUBROKER_OIDC_AUDIENCE": "gpubroker", "GPUBROKER_PROFILES_FILE": profiles,
	}
}

func withBasics(c config.Config, profiles string) config.Config {
	c.Redis.URL, c.OIDCIssuer, c.OIDCAudience, c.ProfilesFile = "redis://127.0.0.1:6390/0", "https://idp.example", "gpubroker", profiles
	return c
}

// merge returns base with over's entries on top.
func merge(base, over map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func defaults(mode config.Mode) config.Config {
	c := config.Config{
		Mode:                   mode,
		Listen:                 ":8080",
		MetricsListen:          ":9090",
		Redis:                  cliconfig.Redis{Prefix: "gpubroker:"},
		RedisWaitReplicas:      -1,
		RedisWaitTimeout:       time.Second,
		Kube:                   cliconfig.Kube{QPS: 50, Burst: 100},
		RedisStreamConnections: 1000,
		PodResync:              5 * time.Second,
		Namespace:              "gpubroker-notebooks",
		OIDCUsernameClaim:      "preferred_username",
		OIDCGroupsClaim:        "groups",
		AdminGroup:             "gpubroker-admins",
		PlacementPolicy:        fleet.PolicyBinpack,
		HostRoot:               "/var/lib/gpubroker",
		GPUExposure:            config.ExposureNVIDIARuntime,
		RuntimeClass:           "nvidia",
		ReconcileInterval:      30 * time.Second,
		OrphanGrace:            2 * time.Minute,
		StartTimeout:           5 * time.Minute,
		ShutdownTimeout:        20 * time.Second,
		SessionTTL:             12 * time.Hour,
		ReclaimInterval:        30 * time.Second,
		LeaseName:              "gpubroker-reclaimer",
		LeaseDuration:          15 * time.Second,
		LogLevel:               "info",
		LogFormat:              "json",
		NotebookMode:           "host",
	}
	if mode == config.ModeDev {
		c.LogFormat, c.MetricsListen, c.NotebookMode = "text", "", "path"
	}
	return c
}

func TestLoadPrecedence(t *testing.T) {
	files := map[string]string{}
	for _, name := range []string{"pw", "kc", "hub", "pf"} {
		files[name] = writeFile(t, name, "x\n")
	}
	tests := []struct {
		name string
		mode config.Mode // "" means serve
		args []string
		env  map[string]string
		want func(*config.Config)
	}{
		{name: "serve defaults", want: func(*config.Config) {}},
		{name: "dev defaults log text", mode: config.ModeDev, want: func(c *config.Config) {
			*c = defaults(config.ModeDev)
		}},
		{
			name: "env beats default",
			env: map[string]string{
				"GPUBROKER_LISTEN": ":9090", "GPUBROKER_RECONCILE_INTERVAL": "1m", "GPUBROKER_CHECK_CONFIG": "true",
				"GPUBROKER_REDIS_URL": "", "GPUBROKER_REDIS_SENTINEL_MASTER": "m",
				"GPUBROKER_REDIS_SENTINEL_ADDRS": "s1:27001, s2:27001,",
				"GPUBROKER_PLACEMENT_POLICY":     "spread", "GPUBROKER_LOG_FORMAT": "text",
			},
			want: func(c *config.Config) {
				c.Listen, c.ReconcileInterval, c.CheckConfig = ":9090", time.Minute, true
				c.Redis.URL, c.Redis.SentinelMaster, c.Redis.SentinelAddrs = "", "m", []string{"s1:27001", "s2:27001"}
				c.PlacementPolicy, c.LogFormat = fleet.PolicySpread, "text"
			},
		},
		{
			name: "flag beats env",
			args: []string{"--listen=:7070", "-reconcile-interval", "5s", "--redis-url=redis://r:1/0", "--check-config=false", "--log-format", "json"},
			env: map[string]string{
				"GPUBROKER_LISTEN": ":9090", "GPUBROKER_RECONCILE_INTERVAL": "1m", "GPUBROKER_CHECK_CONFIG": "true",
				"GPUBROKER_REDIS_URL": "redis://s1:27001", "GPUBROKER_LOG_FORMAT": "text",
			},
			want: func(c *config.Config) {
				c.Listen, c.ReconcileInterval, c.Redis.URL = ":7070", 5*time.Second, "redis://r:1/0"
			},
		},
		{
			name: "a flag over a bad variable wins quietly",
			args: []string{"--orphan-grace=1m", "--check-config"},
			env:  map[string]string{"GPUBROKER_ORPHAN_GRACE": "soon", "GPUBROKER_CHECK_CONFIG": "perhaps"},
			want: func(c *config.Config) {
				c.OrphanGrace, c.CheckConfig = time.Minute, true
			},
		},
		{
			name: "other programs' variables are not warned about",
			env: map[string]string{"GPUBROKER_AGENT_NODE": "n1", "GPUBROKER_TEST_REDIS_SERVER": "/r", "GPUBROKER_STUB_STATE": "/s",
				"GPUBROKER_LIMITER_LOG": "debug", "GPUBROKER_POD_IP": "10.0.0.7", "GPUBROKER_BASE_URL": "/user/a/b/", "NOT_GPUBROKER_X": "1"},
			want: func(*config.Config) {},
		},
		{
			name: "empty env is unset",
			env:  map[string]string{"GPUBROKER_LISTEN": "", "GPUBROKER_NAMESPACE": ""},
			want: func(*config.Config) {},
		},
		{
			name: "every string flag",
			args: []string{
				"--public-url=https://gpu.example", "--notebook-domain=nb.gpu.example", "--redis-url=redis://r:7001/1",
				"--redis-prefix=gb:", "--namespace=nb",
				"--oidc-issuer=https://idp", "--oidc-audience=aud", "--oidc-username-claim=email",
				"--oidc-groups-claim=roles", "--admin-group=root",
				"--host-root=/hr", "--gpu-exposure=cdi", "--runtime-class=", "--orphan-grace=1m",
				"--start-timeout=1m", "--shutdown-timeout=1s", "--log-level=debug",
			},
			want: func(c *config.Config) {
				c.PublicURL, c.NotebookDomain, c.Redis.URL = "https://gpu.example", "nb.gpu.example", "redis://r:7001/1"
				c.Redis.Prefix, c.Namespace = "gb:", "nb"
				c.OIDCIssuer, c.OIDCAudience, c.OIDCUsernameClaim = "https://idp", "aud", "email"
				c.OIDCGroupsClaim, c.AdminGroup = "roles", "root"
				c.HostRoot, c.GPUExposure, c.RuntimeClass = "/hr", config.ExposureCDI, ""
				c.OrphanGrace, c.StartTimeout, c.ShutdownTimeout, c.LogLevel = time.Minute, time.Minute, time.Second, "debug"
			},
		},
		{
			name: "every file flag",
			args: []string{"--redis-password-file=" + files["pw"], "--kubeconfig=" + files["kc"], "--hub-token-file=" + files["hub"], "--profiles-file=" + files["pf"]},
			want: func(c *config.Config) {
				c.Redis.PasswordFile, c.Kube.Kubeconfig, c.HubTokenFile, c.ProfilesFile = files["pw"], files["kc"], files["hub"], files["pf"]
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mode := tc.mode
			if mode == "" {
				mode = config.ModeServe
			}
			profiles := writeFile(t, "profiles.yaml", "profiles: []\n")
			env := tc.env
			if mode == config.ModeServe {
				env = merge(serveBasics(profiles), tc.env)
			}
			got, warnings, err := config.Load(mode, tc.args, cliconfigtest.Environ(env))
			if err != nil || len(warnings) > 0 {
				t.Fatalf("Load: %v (warnings %q)", err, warnings)
			}
			want := withBasics(defaults(config.ModeServe), profiles)
			tc.want(&want)
			if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadReportsEveryProblemAtOnce gives many problems of every kind in
// one run (unknown flags, values that do not parse in flags and variables, a
// flag without its value, stray arguments, failed checks, misspelled
// variables): each is reported once, in the user's terms, flags written
// with --, variables naming the form they want.
func TestLoadReportsEveryProblemAtOnce(t *testing.T) {
	tests := []struct {
		name         string
		mode         config.Mode
		args         []string
		env          map[string]string
		want         []string
		wantWarnings []string
	}{
		{name: "unknown mode", mode: "serverless", want: []string{`unknown mode "serverless": want "serve" or "dev"`}},
		{
			name: "everything at once",
			mode: config.ModeServe,
			args: []string{"--nope", "--redis-ulr=redis://x", "--start-timeout=5", "-reconcile-interval", "10ms",
				"--check-config=maybe", "--namespace=Notebooks", "extra", "--", "--listen=:1"},
			env: map[string]string{
				"GPUBROKER_ORPHAN_GRACE": "soon", "GPUBROKER_SHUTDOWN_TIMEOUT": "1 minute", "GPUBROKER_LOG_LEVEL": "loud",
				"GPUBROKER_REDIS_PREFX": "gb:", "GPUBROKER_FOO": "1", "GPUBROKER_QUOTA_FILE": "/q",
			},
			want: []string{
				`--nope: no such flag (see gpubroker serve --help)`,
				`--redis-ulr: no such flag; did you mean --redis-url? (see gpubroker serve --help)`,
				`--start-timeout "5" is not a duration such as 30s, 2m or 1h`,
				`--check-config "maybe" is not true or false`,
				`unexpected arguments ["extra" "--listen=:1"]: gpubroker serve takes only flags (see gpubroker serve --help)`,
				`GPUBROKER_ORPHAN_GRACE="soon" is not a duration such as 30s, 2m or 1h (for --orphan-grace)`,
				`GPUBROKER_SHUTDOWN_TIMEOUT="1 minute" is not a duration such as 30s, 2m or 1h (for --shutdown-timeout)`,
				`--redis-url (GPUBROKER_REDIS_URL): a Redis is required in serve mode: set --redis-url, or --redis-sentinel-master with --redis-sentinel-addrs`,
				`--namespace (GPUBROKER_NAMESPACE): "Notebooks" is not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)`,
				`--oidc-issuer (GPUBROKER_OIDC_ISSUER): is required in serve mode`,
				`--oidc-audience (GPUBROKER_OIDC_AUDIENCE): is required in serve mode and whenever --oidc-issuer is set`,
				`--profiles-file (GPUBROKER_PROFILES_FILE): is required in serve mode`,
				`--reconcile-interval (GPUBROKER_RECONCILE_INTERVAL): must be at least 1s, got 10ms`,
				`--log-level (GPUBROKER_LOG_LEVEL): must be one of debug, info, warn, error, got "loud"`,
			},
			wantWarnings: []string{
				`GPUBROKER_FOO is set, but gpubroker serve has no such setting (see gpubroker serve --help)`,
				// The hook's old variables: nothing reads them any more.
				`GPUBROKER_QUOTA_FILE is set, but gpubroker serve has no such setting (see gpubroker serve --help)`,
				`GPUBROKER_REDIS_PREFX is set, but gpubroker serve has no such setting; did you mean GPUBROKER_REDIS_PREFIX?`,
			},
		},
		{
			name: "a flag without its value",
			mode: config.ModeDev,
			args: []string{"--listen"},
			want: []string{`--listen needs a value (text)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, warnings, err := config.Load(tc.mode, tc.args, cliconfigtest.Environ(tc.env))
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			if diff := cmp.Diff(tc.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantWarnings, warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		// Help wins over every problem, even a bad flag before it.
		if _, _, err := config.Load(config.ModeServe, []string{"--nope", arg}, nil); !errors.Is(err, cliconfig.ErrHelp) {
			t.Errorf("Load(serve %s) = %v, want cliconfig.ErrHelp", arg, err)
		}
	}
	if _, _, err := config.Load(config.ModeDev, []string{"--version"}, nil); !errors.Is(err, cliconfig.ErrVersion) {
		t.Errorf("Load(dev --version) = %v, want cliconfig.ErrVersion", err)
	}
	u := config.Usage(config.ModeServe)
	for _, want := range []string{
		"Usage: gpubroker serve [flags]",
		"  --listen ADDR\n      Address the HTTP server listens on, host:port.\n      env GPUBROKER_LISTEN, default \":8080\"\n",
		"  --reconcile-interval DURATION\n",
		"env GPUBROKER_RECONCILE_INTERVAL, default \"30s\"",
		`env GPUBROKER_LOG_FORMAT, default "json"`,
		"  --check-config\n",
		"env GPUBROKER_CHECK_CONFIG, default false",
		"env GPUBROKER_REDIS_PASSWORD_FILE, default none",
	} {
		if !strings.Contains(u, want) {
			t.Errorf("Usage lacks %q", want)
		}
	}
	// Every flag is listed with its variable, and every listed flag exists.
	for _, name := range []string{
		"listen", "public-url", "redis-url", "redis-sentinel-master", "redis-sentinel-addrs", "redis-password-file",
		"redis-prefix", "kubeconfig", "namespace", "oidc-issuer", "oidc-audience", "oidc-username-claim",
		"oidc-groups-claim", "admin-group", "hub-token-file", "oidc-client-id", "oidc-client-secret-file", "session-ttl", "profiles-file", "placement-policy", "host-root",
		"gpu-exposure", "runtime-class", "reconcile-interval", "orphan-grace", "start-timeout", "shutdown-timeout",
		"reclaim-interval", "hub-url", "hub-api-token-file", "leader-election-namespace", "lease-name",
		"kube-api-qps", "kube-api-burst", "pod-resync", "connect", "redis-stream-connections",
		"log-level", "log-format", "check-config",
	} {
		if !strings.Contains(u, "  --"+name) || !strings.Contains(u, "env "+config.EnvName(name)+",") {
			t.Errorf("Usage lacks flag %s or its variable %s", name, config.EnvName(name))
		}
		if _, _, err := config.Load(config.ModeDev, []string{"--" + name + "=1"}, nil); err != nil && strings.Contains(err.Error(), "no such flag") {
			t.Errorf("flag %s is listed but not registered", name)
		}
	}
	if dev := config.Usage(config.ModeDev); !strings.HasPrefix(dev, "Usage: gpubroker dev [flags]") || !strings.Contains(dev, `env GPUBROKER_LOG_FORMAT, default "text"`) {
		t.Error("dev usage does not name the dev mode or its text log default")
	}
}

// validServe returns a serve configuration that passes Validate, with real
// files for every path.
func validServe(t *testing.T) config.Config {
	t.Helper()
	c := defaults(config.ModeServe)
	c.Redis.URL = "redis://127.0.0.1:6390/0"
	c.Redis.PasswordFile = writeFile(t, "redis-password", "pw\n")
	c.OIDCIssuer = "https://idp.example/realms/x"
	c.OIDCAudience = "gpubroker"
	c.HubTokenFile = writeFile(t, "hub-token", "hub\n")
	c.ProfilesFile = writeFile(t, "profiles.yaml", "profiles: []\n")
	c.Kube.Kubeconfig = writeFile(t, "kubeconfig", "apiVersion: v1\n")
	c.PublicURL, c.NotebookDomain = "https://gpu.example", "nb.gpu.example"
	return c
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name   string
		mutate func(*config.Config)
		want   []string
	}{
		{name: "valid serve", mutate: func(*config.Config) {}},
		{name: "valid serve with sentinel", mutate: func(c *config.Config) {
			c.Redis.URL, c.Redis.SentinelMaster, c.Redis.SentinelAddrs = "", "mymaster", []string{"s1:27001", "[::1]:27001"}
		}},
		{name: "dev needs nothing", mutate: func(c *config.Config) {
			*c = defaults(config.ModeDev)
		}},
		{name: "path mode needs no notebook domain", mutate: func(c *config.Config) {
			c.NotebookMode, c.NotebookDomain = "path", ""
		}},
		{name: "host mode needs a notebook domain", mutate: func(c *config.Config) { c.NotebookDomain = "" },
			want: []string{"--notebook-domain (GPUBROKER_NOTEBOOK_DOMAIN): is required with --notebook-mode=host and --public-url (or use --notebook-mode=path)"}},
		{
			name: "serve requires issuer, audience, redis and profiles",
			mutate: func(c *config.Config) {
				c.OIDCIssuer, c.OIDCAudience, c.Redis.URL, c.ProfilesFile = "", "", "", ""
			},
			want: []string{
				"--redis-url (GPUBROKER_REDIS_URL): a Redis is required in serve mode: set --redis-url, or --redis-sentinel-master with --redis-sentinel-addrs",
				"--oidc-issuer (GPUBROKER_OIDC_ISSUER): is required in serve mode",
				"--oidc-audience (GPUBROKER_OIDC_AUDIENCE): is required in serve mode and whenever --oidc-issuer is set",
				"--profiles-file (GPUBROKER_PROFILES_FILE): is required in serve mode",
			},
		},
		{
			name: "dev with an issuer needs an audience",
			mutate: func(c *config.Config) {
				*c = defaults(config.ModeDev)
				c.OIDCIssuer = "http://127.0.0.1:5556"
			},
			want: []string{"--oidc-audience (GPUBROKER_OIDC_AUDIENCE): is required in serve mode and whenever --oidc-issuer is set"},
		},
		{
			name: "every other problem at once",
			mutate: func(c *config.Config) {
				c.Mode = "batch"
				c.Listen = "8080"
				c.PublicURL = "gpu.example"
				c.NotebookMode = "subdomain"
				c.NotebookDomain = "not a domain"
				c.Redis.URL = "redis://:secretpw@host:7001/notadb"
				c.Redis.PasswordFile = missing
				c.Redis.Prefix = "{gb}:"
				c.Kube.Kubeconfig = dir
				c.Namespace = "Notebooks"
				c.OIDCIssuer = "https://idp.example?x=1"
				c.OIDCUsernameClaim = ""
				c.OIDCGroupsClaim = " "
				c.HubTokenFile = missing
				c.ProfilesFile = missing
				c.PlacementPolicy = "random"
				c.HostRoot = "var/lib"
				c.GPUExposure = "pci"
				c.RuntimeClass = "NVIDIA"
				c.ReconcileInterval = 10 * time.Millisecond
				c.OrphanGrace = 0
				c.StartTimeout = -time.Second
				c.ShutdownTimeout = 0
				c.MetricsListen = "9090"
				c.RedisWaitReplicas = -2
				c.RedisWaitTimeout = 5 * time.Second
				c.LeaseDuration = time.Second
				c.LogLevel = "verbose"
				c.LogFormat = "xml"
			},
			want: []string{
				`mode "batch" is neither "serve" nor "dev"`,
				`--listen (GPUBROKER_LISTEN): "8080" is not host:port`,
				`--metrics-listen (GPUBROKER_METRICS_LISTEN): "9090" is not host:port`,
				`--public-url (GPUBROKER_PUBLIC_URL): "gpu.example" is not an absolute http(s) URL`,
				`--notebook-mode (GPUBROKER_NOTEBOOK_MODE): must be one of host, path, got "subdomain"`,
				`--notebook-domain (GPUBROKER_NOTEBOOK_DOMAIN): "not a domain" is not a DNS name`,
				`--redis-url (GPUBROKER_REDIS_URL): redis://:xxxxx@host:7001/notadb is not a valid Redis URL (want redis://[user:password@]host:port[/db])`,
				`--redis-password-file (GPUBROKER_REDIS_PASSWORD_FILE): cannot use ` + missing + `: stat ` + missing + `: no such file or directory`,
				`--redis-prefix (GPUBROKER_REDIS_PREFIX): must not contain braces or whitespace (hash tags are added per key), got "{gb}:"`,
				`--redis-wait-replicas (GPUBROKER_REDIS_WAIT_REPLICAS): must be at least -1, got -2`,
				`--redis-wait-timeout (GPUBROKER_REDIS_WAIT_TIMEOUT): must be 1ms..2s, got 5s`,
				`--kubeconfig (GPUBROKER_KUBECONFIG): ` + dir + ` is not a regular file`,
				`--namespace (GPUBROKER_NAMESPACE): "Notebooks" is not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)`,
				`--oidc-issuer (GPUBROKER_OIDC_ISSUER): "https://idp.example?x=1" must not have a query or fragment`,
				`--oidc-username-claim (GPUBROKER_OIDC_USERNAME_CLAIM): is empty`,
				`--oidc-groups-claim (GPUBROKER_OIDC_GROUPS_CLAIM): is empty`,
				`--hub-token-file (GPUBROKER_HUB_TOKEN_FILE): cannot use ` + missing + `: stat ` + missing + `: no such file or directory`,
				`--profiles-file (GPUBROKER_PROFILES_FILE): cannot use ` + missing + `: stat ` + missing + `: no such file or directory`,
				`--placement-policy (GPUBROKER_PLACEMENT_POLICY): must be binpack or spread, got "random"`,
				`--host-root (GPUBROKER_HOST_ROOT): must be an absolute path, got "var/lib"`,
				`--gpu-exposure (GPUBROKER_GPU_EXPOSURE): must be nvidia-runtime or cdi, got "pci"`,
				`--runtime-class (GPUBROKER_RUNTIME_CLASS): "NVIDIA" is not a Kubernetes object name (lowercase DNS subdomain)`,
				`--reconcile-interval (GPUBROKER_RECONCILE_INTERVAL): must be at least 1s, got 10ms`,
				`--orphan-grace (GPUBROKER_ORPHAN_GRACE): must be > 0, got 0s`,
				`--start-timeout (GPUBROKER_START_TIMEOUT): must be > 0, got -1s`,
				`--shutdown-timeout (GPUBROKER_SHUTDOWN_TIMEOUT): must be > 0, got 0s`,
				`--lease-duration (GPUBROKER_LEASE_DURATION): must be at least 3s, got 1s`,
				`--log-level (GPUBROKER_LOG_LEVEL): must be one of debug, info, warn, error, got "verbose"`,
				`--log-format (GPUBROKER_LOG_FORMAT): must be one of json, text, got "xml"`,
			},
		},
		{
			name: "reclaimer settings",
			mutate: func(c *config.Config) {
				c.ReclaimInterval = time.Second
				c.HubURL = "hub:8081"
				c.LeaderElectionNamespace = "Broker"
				c.LeaseName = ""
			},
			want: []string{
				`--reclaim-interval (GPUBROKER_RECLAIM_INTERVAL): must be at least 5s, got 1s`,
				`--hub-url (GPUBROKER_HUB_URL): must be an http(s) URL, got "hub:8081"`,
				`--hub-api-token-file (GPUBROKER_HUB_API_TOKEN_FILE): is required with --hub-url`,
				`--leader-election-namespace (GPUBROKER_LEADER_ELECTION_NAMESPACE): "Broker" is not a namespace name`,
				`--lease-name (GPUBROKER_LEASE_NAME): "" is not a Kubernetes object name (lowercase DNS subdomain)`,
			},
		},
		{
			name: "a hub token without the hub",
			mutate: func(c *config.Config) {
				c.HubAPITokenFile = "/run/secrets/hub"
			},
			want: []string{`--hub-url (GPUBROKER_HUB_URL): is required with --hub-api-token-file`},
		},
		{
			name: "redis URL and sentinel together",
			mutate: func(c *config.Config) {
				c.Redis.SentinelMaster = "m"
			},
			want: []string{"--redis-url (GPUBROKER_REDIS_URL): set either --redis-url or the Sentinel pair (--redis-sentinel-master, --redis-sentinel-addrs), not both"},
		},
		{
			name: "redis URL scheme",
			mutate: func(c *config.Config) {
				c.Redis.URL = "http://redis:7001"
			},
			want: []string{`--redis-url (GPUBROKER_REDIS_URL): must start with redis:// or rediss://, got "http://"`},
		},
		{
			name: "unparsable redis URL",
			mutate: func(c *config.Config) {
				c.Redis.URL = "redis://:secretpw@host:port"
			},
			want: []string{"--redis-url (GPUBROKER_REDIS_URL): is not a valid URL (want redis://[user:password@]host:port[/db])"},
		},
		{
			name: "sentinel halves",
			mutate: func(c *config.Config) {
				c.Redis.URL, c.Redis.SentinelAddrs = "", []string{"s1", "s2:27001"}
			},
			want: []string{
				"--redis-sentinel-master (GPUBROKER_REDIS_SENTINEL_MASTER): is required with --redis-sentinel-addrs",
				`--redis-sentinel-addrs (GPUBROKER_REDIS_SENTINEL_ADDRS): "s1" is not host:port`,
			},
		},
		{
			name: "sentinel master alone",
			mutate: func(c *config.Config) {
				c.Redis.URL, c.Redis.SentinelMaster = "", "m"
			},
			want: []string{"--redis-sentinel-addrs (GPUBROKER_REDIS_SENTINEL_ADDRS): is required with --redis-sentinel-master"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validServe(t)
			tc.mutate(&c)
			err := c.Validate()
			var got []string
			if err != nil {
				got = strings.Split(err.Error(), "\n")
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			if err != nil && strings.Contains(err.Error(), "secretpw") {
				t.Errorf("Validate echoes a password: %v", err)
			}
		})
	}
}

func TestConfigLogRedactsTheRedisPassword(t *testing.T) {
	var buf bytes.Buffer
	c := defaults(config.ModeServe)
	c.Redis.URL = "redis://u:hunter2@r:7001"
	c.HubTokenFile = "/run/secrets/hub"
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("start", "config", c)
	out := buf.String()
	if strings.Contains(out, "hunter2") {
		t.Errorf("log line leaks the password: %s", out)
	}
	for _, want := range []string{`"mode":"serve"`, `"redis_url":"redis://u:xxxxx@r:7001"`, `"hub_token_file":"/run/secrets/hub"`, `"reconcile_interval":"30s"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %s: %s", want, out)
		}
	}
}

func TestHubToken(t *testing.T) {
	c := defaults(config.ModeServe)
	if s, err := c.HubToken(); err != nil || s != "" {
		t.Errorf("no hub token file: %q, %v; want empty and no error", s.Reveal(), err)
	}
	c.HubTokenFile = writeFile(t, "hub", "tok\n")
	if s, err := c.HubToken(); err != nil || s.Reveal() != "tok" {
		t.Errorf("hub token: %q, %v; want tok", s.Reveal(), err)
	}
}

func TestLogger(t *testing.T) {
	tests := []struct {
		name, format, level string
		wantPrefix          string
		wantDebug           bool
	}{
		{"json at info", "json", "info", `{"time":`, false},
		{"text at debug", "text", "debug", `time=`, true},
		{"unparsable level falls back to info", "json", "loud", `{"time":`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults(config.ModeServe)
			c.LogFormat, c.LogLevel = tc.format, tc.level
			var buf bytes.Buffer
			log := c.Logger(&buf)
			log.Debug("debug line")
			log.Info("info line")
			out := buf.String()
			if !strings.HasPrefix(out, tc.wantPrefix) {
				t.Errorf("output %q does not start with %q", out, tc.wantPrefix)
			}
			if got := strings.Contains(out, "debug line"); got != tc.wantDebug {
				t.Errorf("debug line logged = %v, want %v", got, tc.wantDebug)
			}
			if !strings.Contains(out, "info line") {
				t.Errorf("info line missing from %q", out)
			}
		})
	}
}

func TestWaitReplicasFollowsTheRedisSetup(t *testing.T) {
	tests := []struct {
		name     string
		flag     int
		sentinel bool
		want     int
	}{
		{name: "default with a URL waits for none", flag: -1, want: 0},
		{name: "default with Sentinel waits for one replica", flag: -1, sentinel: true, want: 1},
		{name: "an explicit count wins with Sentinel", flag: 2, sentinel: true, want: 2},
		{name: "zero turns the wait off with Sentinel", flag: 0, sentinel: true, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults(config.ModeServe)
			c.RedisWaitReplicas = tc.flag
			if tc.sentinel {
				c.Redis.SentinelMaster = "m"
			}
			if got := c.WaitReplicas(); got != tc.want {
				t.Errorf("WaitReplicas() = %d, want %d", got, tc.want)
			}
		})
	}
}
