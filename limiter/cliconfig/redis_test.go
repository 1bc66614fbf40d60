package cliconfig_test

import (
	"bytes"
	"errors"
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

	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRedisOptions(t *testing.T) {
	pwFile := writeFile(t, "pw", "from-file\r\n")
	tests := []struct {
		name   string
		mutate func(*cliconfig.Redis)
		want   redis.UniversalOptions
	}{
		{
			name:   "url with user, password and db",
			mutate: func(c *cliconfig.Redis) { c.URL = "redis://u:p@r.example:6380/3" },
			want:   redis.UniversalOptions{Addrs: []string{"r.example:6380"}, Username: "u", Password: "p", DB: 3},
		},
		{
			name:   "password file overrides the url",
			mutate: func(c *cliconfig.Redis) { c.URL, c.PasswordFile = "redis://:p@r:6379", pwFile },
			want:   redis.UniversalOptions{Addrs: []string{"r:6379"}, Password: "from-file"},
		},
		{
			name:   "url timeouts win",
			mutate: func(c *cliconfig.Redis) { c.URL = "redis://r:6379?read_timeout=9s&dial_timeout=-1" },
			want:   redis.UniversalOptions{Addrs: []string{"r:6379"}, ReadTimeout: 9 * time.Second, DialTimeout: -1},
		},
		{
			name: "sentinel",
			mutate: func(c *cliconfig.Redis) {
				c.SentinelMaster, c.SentinelAddrs, c.PasswordFile = "mymaster", []string{"a:1", "b:2"}, pwFile
			},
			want: redis.UniversalOptions{MasterName: "mymaster", Addrs: []string{"a:1", "b:2"}, Password: "from-file"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c cliconfig.Redis
			tc.mutate(&c)
			got, err := c.Options()
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.ContextTimeoutEnabled = true
			if want.DialTimeout == 0 {
				want.DialTimeout = cliconfig.RedisDialTimeout
			}
			if want.ReadTimeout == 0 {
				want.ReadTimeout = cliconfig.RedisReadTimeout
			}
			want.WriteTimeout = cliconfig.RedisWriteTimeout
			if diff := cmp.Diff(want, *got, cmpopts.IgnoreUnexported(redis.UniversalOptions{}), cmpopts.IgnoreFields(redis.UniversalOptions{}, "TLSConfig")); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
		})
	}

	c := cliconfig.Redis{URL: "rediss://r:6379"}
	o, err := c.Options()
	if err != nil || o.TLSConfig == nil {
		t.Errorf("rediss: TLSConfig %v, err %v; want TLS", o, err)
	}
	if _, err := (cliconfig.Redis{}).Options(); !errors.Is(err, cliconfig.ErrNoRedis) {
		t.Errorf("no Redis configured: %v, want ErrNoRedis", err)
	}
	c.PasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := c.Options(); err == nil {
		t.Error("missing password file: no error")
	}
}

func TestRedisFlagsReportEachProblemOnItsFlag(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		r    cliconfig.Redis
		req  cliconfig.RedisRequirement
		want []string
	}{
		{name: "nothing, optional", r: cliconfig.Redis{Prefix: "p:"}},
		{name: "nothing, required", r: cliconfig.Redis{Prefix: "p:"}, req: cliconfig.RedisRequirement{Required: true},
			want: []string{"--redis-url (T_REDIS_URL): a Redis is required: set --redis-url, or --redis-sentinel-master with --redis-sentinel-addrs"}},
		{name: "url and sentinel", r: cliconfig.Redis{URL: "redis://r:1", SentinelMaster: "m", SentinelAddrs: []string{"bad"}},
			want: []string{"--redis-url (T_REDIS_URL): set either --redis-url or the Sentinel pair (--redis-sentinel-master, --redis-sentinel-addrs), not both"}},
		{name: "every field bad", r: cliconfig.Redis{SentinelAddrs: []string{"a", "b:99999"}, PasswordFile: missing, Prefix: "{x} "},
			want: []string{
				"--redis-sentinel-master (T_REDIS_SENTINEL_MASTER): is required with --redis-sentinel-addrs",
				`--redis-sentinel-addrs (T_REDIS_SENTINEL_ADDRS): "a" is not host:port`,
				`--redis-sentinel-addrs (T_REDIS_SENTINEL_ADDRS): "b:99999" has no port number 0..65535`,
				"--redis-password-file (T_REDIS_PASSWORD_FILE): cannot use " + missing + ": stat " + missing + ": no such file or directory",
				`--redis-prefix (T_REDIS_PREFIX): must not contain braces or whitespace (hash tags are added per key), got "{x} "`,
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			tab := &cliconfig.Table{Program: "t", EnvPrefix: "T_", Flags: r.Flags(tc.req)}
			var got []string
			if err := tab.Validate(); err != nil {
				got = strings.Split(err.Error(), "\n")
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	s, err := cliconfig.ReadSecret(writeFile(t, "s", "hunter2\n"))
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
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("start", "secret", s)
	if strings.Contains(buf.String(), "hunter2") || !strings.Contains(buf.String(), `"secret":"REDACTED"`) {
		t.Errorf("log line leaks or lacks redaction: %s", buf.String())
	}
	if _, err := cliconfig.ReadSecret(writeFile(t, "empty", "\n")); err == nil {
		t.Error("empty secret file: no error")
	}
}
