package config_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
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
		Mode:              mode,
		Listen:            ":8080",
		RedisPrefix:       "gpubroker:",
		Namespace:         "gpubroker-notebooks",
		OIDCUsernameClaim: "preferred_username",
		OIDCGroupsClaim:   "groups",
		AdminGroup:        "gpubroker-admins",
		PlacementPolicy:   fleet.PolicyBinpack,
		HostRoot:          "/var/lib/gpubroker",
		GPUExposure:       config.ExposureNVIDIARuntime,
		RuntimeClass:      "nvidia",
		ReconcileInterval: 30 * time.Second,
		OrphanGrace:       2 * time.Minute,
		StartTimeout:      5 * time.Minute,
		ShutdownTimeout:   20 * time.Second,
		SessionTTL:        12 * time.Hour,
		ReclaimInterval:   30 * time.Second,
		LeaseName:         "gpubroker-reclaimer",
		LogLevel:          "info",
		LogFormat:         "json",
		DevGPUs:           8,
	}
	if mode == config.ModeDev {
		c.LogFormat = "text"
	}
	return c
}

func TestLoadPrecedence(t *testing.T) {
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
				"GPUBROKER_REDIS_SENTINEL_ADDRS": "s1:26379, s2:26379,", "GPUBROKER_DEV_GPUS": "2",
				"GPUBROKER_PLACEMENT_POLICY": "spread", "GPUBROKER_LOG_FORMAT": "text",
			},
			want: func(c *config.Config) {
				c.Listen, c.ReconcileInterval, c.CheckConfig = ":9090", time.Minute, true
				c.RedisSentinelAddrs, c.DevGPUs = []string{"s1:26379", "s2:26379"}, 2
				c.PlacementPolicy, c.LogFormat = fleet.PolicySpread, "text"
			},
		},
		{
			name: "flag beats env",
			args: []string{"--listen=:7070", "-reconcile-interval", "5s", "--redis-sentinel-addrs=x:1", "--check-config=false", "--log-format", "json"},
			env: map[string]string{
				"GPUBROKER_LISTEN": ":9090", "GPUBROKER_RECONCILE_INTERVAL": "1m", "GPUBROKER_CHECK_CONFIG": "true",
				"GPUBROKER_REDIS_SENTINEL_ADDRS": "s1:26379", "GPUBROKER_LOG_FORMAT": "text",
			},
			want: func(c *config.Config) {
				c.Listen, c.ReconcileInterval, c.RedisSentinelAddrs = ":7070", 5*time.Second, []string{"x:1"}
			},
		},
		{
			name: "empty env is unset",
			env:  map[string]string{"GPUBROKER_LISTEN": "", "GPUBROKER_NAMESPACE": ""},
			want: func(*config.Config) {},
		},
		{
			name: "every string flag",
			args: []string{
				"--public-url=https://gpu.example", "--redis-url=redis://r:6379/1", "--redis-sentinel-master=m",
				"--redis-password-file=/p", "--redis-prefix=gb:", "--kubeconfig=/k", "--namespace=nb",
				"--oidc-issuer=https://idp", "--oidc-audience=aud", "--oidc-username-claim=email",
				"--oidc-groups-claim=roles", "--admin-group=root", "--hub-token-file=/h", "--profiles-file=/pf",
				"--host-root=/hr", "--gpu-exposure=cdi", "--runtime-class=", "--orphan-grace=1m",
				"--start-timeout=1m", "--shutdown-timeout=1s", "--log-level=debug",
			},
			want: func(c *config.Config) {
				c.PublicURL, c.RedisURL, c.RedisSentinelMaster = "https://gpu.example", "redis://r:6379/1", "m"
				c.RedisPasswordFile, c.RedisPrefix, c.Kubeconfig, c.Namespace = "/p", "gb:", "/k", "nb"
				c.OIDCIssuer, c.OIDCAudience, c.OIDCUsernameClaim = "https://idp", "aud", "email"
				c.OIDCGroupsClaim, c.AdminGroup, c.HubTokenFile, c.ProfilesFile = "roles", "root", "/h", "/pf"
				c.HostRoot, c.GPUExposure, c.RuntimeClass = "/hr", config.ExposureCDI, ""
				c.OrphanGrace, c.StartTimeout, c.ShutdownTimeout, c.LogLevel = time.Minute, time.Minute, time.Second, "debug"
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mode := tc.mode
			if mode == "" {
				mode = config.ModeServe
			}
			got, err := config.Load(mode, tc.args, env(tc.env), nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			want := defaults(config.ModeServe)
			tc.want(&want)
			if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		mode config.Mode
		args []string
		env  map[string]string
		want []string
	}{
		{name: "unknown mode", mode: "serverless", want: []string{`config: unknown mode "serverless": want "serve" or "dev"`}},
		{
			name: "bad env values and an unknown flag, all at once",
			mode: config.ModeServe,
			args: []string{"--nope"},
			env:  map[string]string{"GPUBROKER_ORPHAN_GRACE": "soon", "GPUBROKER_DEV_GPUS": "many"},
			want: []string{
				`config: GPUBROKER_DEV_GPUS="many": parse error`,
				`config: GPUBROKER_ORPHAN_GRACE="soon": parse error`,
				`config: flag provided but not defined: -nope (see gpubroker serve --help)`,
			},
		},
		{
			name: "bad flag value",
			mode: config.ModeDev,
			args: []string{"--start-timeout=5"},
			want: []string{`config: invalid value "5" for flag -start-timeout: parse error (see gpubroker dev --help)`},
		},
		{
			name: "stray argument",
			mode: config.ModeServe,
			args: []string{"--listen=:1", "extra"},
			want: []string{`config: unexpected arguments ["extra"] (see gpubroker serve --help)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var help bytes.Buffer
			_, err := config.Load(tc.mode, tc.args, env(tc.env), &help)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			if diff := cmp.Diff(tc.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if help.Len() != 0 {
				t.Errorf("Load wrote help text on an error: %q", help.String())
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		var help bytes.Buffer
		if _, err := config.Load(config.ModeServe, []string{arg}, env(nil), &help); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("Load(serve %s) = %v, want flag.ErrHelp", arg, err)
		}
		if diff := cmp.Diff(config.Usage(config.ModeServe), help.String()); diff != "" {
			t.Errorf("help text (-want +got):\n%s", diff)
		}
	}
	if _, err := config.Load(config.ModeDev, []string{"-h"}, env(nil), nil); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("Load(dev -h) with no writer = %v, want flag.ErrHelp", err)
	}
	u := config.Usage(config.ModeServe)
	for _, want := range []string{
		"Usage: gpubroker serve [flags]",
		"  --listen ADDR\n      Address the HTTP server listens on, host:port.\n      env GPUBROKER_LISTEN, default \":8080\"\n",
		"  --reconcile-interval DURATION\n",
		"env GPUBROKER_RECONCILE_INTERVAL, default \"30s\"",
		"env GPUBROKER_LOG_FORMAT, default json in serve mode, text in dev mode",
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
		"log-level", "log-format", "check-config", "dev-gpus",
	} {
		if !strings.Contains(u, "  --"+name) || !strings.Contains(u, "env "+config.EnvName(name)+",") {
			t.Errorf("Usage lacks flag %s or its variable %s", name, config.EnvName(name))
		}
		if _, err := config.Load(config.ModeDev, []string{"--" + name + "=1"}, env(nil), nil); err != nil && strings.Contains(err.Error(), "not defined") {
			t.Errorf("flag %s is listed but not registered", name)
		}
	}
	if !strings.HasPrefix(config.Usage(config.ModeDev), "Usage: gpubroker dev [flags]") {
		t.Error("dev usage does not name the dev mode")
	}
}

// validServe returns a serve configuration that passes Validate, with real
// files for every path.
func validServe(t *testing.T) config.Config {
	t.Helper()
	c := defaults(config.ModeServe)
	c.RedisURL = "redis://127.0.0.1:6390/0"
	c.RedisPasswordFile = writeFile(t, "redis-password", "pw\n")
	c.OIDCIssuer = "https://idp.example/realms/x"
	c.OIDCAudience = "gpubroker"
	c.HubTokenFile = writeFile(t, "hub-token", "hub\n")
	c.ProfilesFile = writeFile(t, "profiles.yaml", "profiles: []\n")
	c.Kubeconfig = writeFile(t, "kubeconfig", "apiVersion: v1\n")
	c.PublicURL = "https://gpu.example"
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
			c.RedisURL, c.RedisSentinelMaster, c.RedisSentinelAddrs = "", "mymaster", []string{"s1:26379", "[::1]:26379"}
		}},
		{name: "dev needs nothing", mutate: func(c *config.Config) {
			*c = defaults(config.ModeDev)
		}},
		{
			name: "serve requires issuer, audience, redis and profiles",
			mutate: func(c *config.Config) {
				c.OIDCIssuer, c.OIDCAudience, c.RedisURL, c.ProfilesFile = "", "", "", ""
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
				c.RedisURL = "redis://:secretpw@host:6379/notadb"
				c.RedisPasswordFile = missing
				c.RedisPrefix = "{gb}:"
				c.Kubeconfig = dir
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
				c.LogLevel = "verbose"
				c.LogFormat = "xml"
			},
			want: []string{
				`mode "batch" is neither "serve" nor "dev"`,
				`--listen (GPUBROKER_LISTEN): "8080" is not host:port`,
				`--public-url (GPUBROKER_PUBLIC_URL): "gpu.example" is not an absolute http(s) URL`,
				`--redis-url (GPUBROKER_REDIS_URL): redis://:xxxxx@host:6379/notadb is not a valid Redis URL (want redis://[user:password@]host:port[/db])`,
				`--redis-password-file (GPUBROKER_REDIS_PASSWORD_FILE): cannot use ` + missing + `: stat ` + missing + `: no such file or directory`,
				`--redis-prefix (GPUBROKER_REDIS_PREFIX): must not contain braces or whitespace (hash tags are added per key), got "{gb}:"`,
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
				c.RedisSentinelMaster = "m"
			},
			want: []string{"--redis-url (GPUBROKER_REDIS_URL): set either --redis-url or the Sentinel pair (--redis-sentinel-master, --redis-sentinel-addrs), not both"},
		},
		{
			name: "redis URL scheme",
			mutate: func(c *config.Config) {
				c.RedisURL = "http://redis:6379"
			},
			want: []string{`--redis-url (GPUBROKER_REDIS_URL): must start with redis:// or rediss://, got "http://"`},
		},
		{
			name: "unparsable redis URL",
			mutate: func(c *config.Config) {
				c.RedisURL = "redis://:secretpw@host:port"
			},
			want: []string{"--redis-url (GPUBROKER_REDIS_URL): is not a valid URL (want redis://[user:password@]host:port[/db])"},
		},
		{
			name: "sentinel halves",
			mutate: func(c *config.Config) {
				c.RedisURL, c.RedisSentinelAddrs = "", []string{"s1", "s2:26379"}
			},
			want: []string{
				"--redis-sentinel-master (GPUBROKER_REDIS_SENTINEL_MASTER): is required with --redis-sentinel-addrs",
				`--redis-sentinel-addrs (GPUBROKER_REDIS_SENTINEL_ADDRS): "s1" is not host:port`,
			},
		},
		{
			name: "sentinel master alone",
			mutate: func(c *config.Config) {
				c.RedisURL, c.RedisSentinelMaster = "", "m"
			},
			want: []string{"--redis-sentinel-addrs (GPUBROKER_REDIS_SENTINEL_ADDRS): is required with --redis-sentinel-master"},
		},
		{
			name: "dev GPUs out of range",
			mutate: func(c *config.Config) {
				*c = defaults(config.ModeDev)
				c.DevGPUs = 65
			},
			want: []string{"--dev-gpus (GPUBROKER_DEV_GPUS): must be 1..64, got 65"},
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

func TestRedisOptions(t *testing.T) {
	pwFile := writeFile(t, "pw", "from-file\r\n")
	tests := []struct {
		name   string
		mutate func(*config.Config)
		want   redis.UniversalOptions
	}{
		{
			name:   "url with user, password and db",
			mutate: func(c *config.Config) { c.RedisURL = "redis://u:p@r.example:6380/3" },
			want:   redis.UniversalOptions{Addrs: []string{"r.example:6380"}, Username: "u", Password: "p", DB: 3},
		},
		{
			name:   "password file overrides the url",
			mutate: func(c *config.Config) { c.RedisURL, c.RedisPasswordFile = "redis://:p@r:6379", pwFile },
			want:   redis.UniversalOptions{Addrs: []string{"r:6379"}, Password: "from-file"},
		},
		{
			name:   "url timeouts win",
			mutate: func(c *config.Config) { c.RedisURL = "redis://r:6379?read_timeout=9s&dial_timeout=-1" },
			want:   redis.UniversalOptions{Addrs: []string{"r:6379"}, ReadTimeout: 9 * time.Second, DialTimeout: -1},
		},
		{
			name: "sentinel",
			mutate: func(c *config.Config) {
				c.RedisSentinelMaster, c.RedisSentinelAddrs, c.RedisPasswordFile = "mymaster", []string{"a:1", "b:2"}, pwFile
			},
			want: redis.UniversalOptions{MasterName: "mymaster", Addrs: []string{"a:1", "b:2"}, Password: "from-file"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults(config.ModeServe)
			tc.mutate(&c)
			got, err := c.RedisOptions()
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.ContextTimeoutEnabled = true
			if want.DialTimeout == 0 {
				want.DialTimeout = config.RedisDialTimeout
			}
			if want.ReadTimeout == 0 {
				want.ReadTimeout = config.RedisReadTimeout
			}
			want.WriteTimeout = config.RedisWriteTimeout
			if diff := cmp.Diff(want, *got, cmpopts.IgnoreUnexported(redis.UniversalOptions{}), cmpopts.IgnoreFields(redis.UniversalOptions{}, "TLSConfig")); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
		})
	}

	c := defaults(config.ModeServe)
	c.RedisURL = "rediss://r:6379"
	o, err := c.RedisOptions()
	if err != nil || o.TLSConfig == nil {
		t.Errorf("rediss: TLSConfig %v, err %v; want TLS", o, err)
	}
	if _, err := defaults(config.ModeDev).RedisOptions(); !errors.Is(err, config.ErrEmbeddedRedis) {
		t.Errorf("no Redis configured: %v, want ErrEmbeddedRedis", err)
	}
	c.RedisPasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := c.RedisOptions(); err == nil {
		t.Error("missing password file: no error")
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	s, err := config.ReadSecret(writeFile(t, "s", "hunter2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Reveal() != "hunter2" {
		t.Errorf("Reveal() = %q, want hunter2", s.Reveal())
	}
	for _, verb := range []string{"%v", "%s", "%q", "%#v", "%+v"} {
		if out := fmt.Sprintf(verb, s); strings.Contains(out, "hunter2") {
			t.Errorf("%s prints %q", verb, out)
		}
	}
	var buf bytes.Buffer
	c := defaults(config.ModeServe)
	c.RedisURL = "redis://u:hunter2@r:6379"
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("start", "secret", s, "config", c)
	if strings.Contains(buf.String(), "hunter2") || !strings.Contains(buf.String(), `"secret":"REDACTED"`) {
		t.Errorf("log line leaks or lacks redaction: %s", buf.String())
	}
	if _, err := config.ReadSecret(writeFile(t, "empty", "\n")); err == nil {
		t.Error("empty secret file: no error")
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
