package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// problems collects validation errors, each naming its flag and variable.
type problems []error

func (p *problems) add(flagName string, err error) {
	*p = append(*p, fmt.Errorf("--%s (%s): %w", flagName, EnvName(flagName), err))
}

// Validate reports every problem with c at once (errors.Join, one line
// each, naming the flag and its variable). It changes nothing; it reads only
// file metadata, to check that configured files exist and are regular files.
func (c Config) Validate() error {
	var p problems
	if c.Mode != ModeServe && c.Mode != ModeDev {
		p = append(p, fmt.Errorf("mode %q is neither %q nor %q", c.Mode, ModeServe, ModeDev))
	}
	serve := c.Mode == ModeServe

	if err := checkHostPort(c.Listen); err != nil {
		p.add("listen", err)
	}
	if c.PublicURL != "" {
		if err := checkHTTPURL(c.PublicURL); err != nil {
			p.add("public-url", err)
		}
	}
	c.validateRedis(&p, serve)

	if c.Kubeconfig != "" {
		if err := checkFile(c.Kubeconfig); err != nil {
			p.add("kubeconfig", err)
		}
	}
	if !dns1123Label.MatchString(c.Namespace) || len(c.Namespace) > 63 {
		p.add("namespace", fmt.Errorf("%q is not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)", c.Namespace))
	}

	switch {
	case c.OIDCIssuer == "" && serve:
		p.add("oidc-issuer", errors.New("is required in serve mode"))
	case c.OIDCIssuer != "":
		if err := checkHTTPURL(c.OIDCIssuer); err != nil {
			p.add("oidc-issuer", err)
		}
	}
	if strings.TrimSpace(c.OIDCAudience) == "" && (serve || c.OIDCIssuer != "") {
		p.add("oidc-audience", errors.New("is required in serve mode and whenever --oidc-issuer is set"))
	}
	if strings.TrimSpace(c.OIDCUsernameClaim) == "" {
		p.add("oidc-username-claim", errors.New("is empty"))
	}
	if strings.TrimSpace(c.OIDCGroupsClaim) == "" {
		p.add("oidc-groups-claim", errors.New("is empty"))
	}
	if c.HubTokenFile != "" {
		if err := checkFile(c.HubTokenFile); err != nil {
			p.add("hub-token-file", err)
		}
	}
	if c.OIDCClientSecretFile != "" {
		if err := checkFile(c.OIDCClientSecretFile); err != nil {
			p.add("oidc-client-secret-file", err)
		}
	}

	switch {
	case c.ProfilesFile == "" && serve:
		p.add("profiles-file", errors.New("is required in serve mode"))
	case c.ProfilesFile != "":
		if err := checkFile(c.ProfilesFile); err != nil {
			p.add("profiles-file", err)
		}
	}
	if !c.PlacementPolicy.Valid() {
		p.add("placement-policy", fmt.Errorf("must be binpack or spread, got %q", c.PlacementPolicy))
	}

	if !filepath.IsAbs(c.HostRoot) {
		p.add("host-root", fmt.Errorf("must be an absolute path, got %q", c.HostRoot))
	}
	if c.GPUExposure != ExposureNVIDIARuntime && c.GPUExposure != ExposureCDI {
		p.add("gpu-exposure", fmt.Errorf("must be %s or %s, got %q", ExposureNVIDIARuntime, ExposureCDI, c.GPUExposure))
	}
	if c.RuntimeClass != "" && (len(c.RuntimeClass) > 253 || !dns1123Subdomain.MatchString(c.RuntimeClass)) {
		p.add("runtime-class", fmt.Errorf("%q is not a Kubernetes object name (lowercase DNS subdomain)", c.RuntimeClass))
	}

	for _, d := range []struct {
		flag string
		v    time.Duration
		min  time.Duration
	}{
		{"reconcile-interval", c.ReconcileInterval, time.Second},
		{"orphan-grace", c.OrphanGrace, time.Nanosecond},
		{"start-timeout", c.StartTimeout, time.Nanosecond},
		{"shutdown-timeout", c.ShutdownTimeout, time.Nanosecond},
		{"session-ttl", c.SessionTTL, time.Minute},
		{"reclaim-interval", c.ReclaimInterval, 5 * time.Second},
	} {
		if d.v < d.min {
			if d.min == time.Nanosecond {
				p.add(d.flag, fmt.Errorf("must be > 0, got %s", d.v))
			} else {
				p.add(d.flag, fmt.Errorf("must be at least %s, got %s", d.min, d.v))
			}
		}
	}

	if c.HubURL != "" {
		if u, err := url.Parse(c.HubURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.add("hub-url", fmt.Errorf("must be an http(s) URL, got %q", c.HubURL))
		}
		if c.HubAPITokenFile == "" {
			p.add("hub-api-token-file", errors.New("is required with --hub-url"))
		}
	} else if c.HubAPITokenFile != "" {
		p.add("hub-url", errors.New("is required with --hub-api-token-file"))
	}
	if c.LeaderElectionNamespace != "" && !dns1123Label.MatchString(c.LeaderElectionNamespace) {
		p.add("leader-election-namespace", fmt.Errorf("%q is not a namespace name", c.LeaderElectionNamespace))
	}
	if c.LeaseName == "" || len(c.LeaseName) > 253 || !dns1123Subdomain.MatchString(c.LeaseName) {
		p.add("lease-name", fmt.Errorf("%q is not a Kubernetes object name (lowercase DNS subdomain)", c.LeaseName))
	}

	if !slices.Contains(logLevels, c.LogLevel) {
		p.add("log-level", fmt.Errorf("must be one of %s, got %q", strings.Join(logLevels, ", "), c.LogLevel))
	}
	if !slices.Contains(logFormats, c.LogFormat) {
		p.add("log-format", fmt.Errorf("must be one of %s, got %q", strings.Join(logFormats, ", "), c.LogFormat))
	}
	if c.Mode == ModeDev && (c.DevGPUs < 1 || c.DevGPUs > 64) {
		p.add("dev-gpus", fmt.Errorf("must be 1..64, got %d", c.DevGPUs))
	}
	return errors.Join(p...)
}

func (c Config) validateRedis(p *problems, serve bool) {
	sentinel := c.RedisSentinelMaster != "" || len(c.RedisSentinelAddrs) > 0
	switch {
	case c.RedisURL != "" && sentinel:
		p.add("redis-url", errors.New("set either --redis-url or the Sentinel pair (--redis-sentinel-master, --redis-sentinel-addrs), not both"))
	case c.RedisURL != "":
		if err := checkRedisURL(c.RedisURL); err != nil {
			p.add("redis-url", err)
		}
	case sentinel:
		if c.RedisSentinelMaster == "" {
			p.add("redis-sentinel-master", errors.New("is required with --redis-sentinel-addrs"))
		}
		if len(c.RedisSentinelAddrs) == 0 {
			p.add("redis-sentinel-addrs", errors.New("is required with --redis-sentinel-master"))
		}
		for _, a := range c.RedisSentinelAddrs {
			if err := checkHostPort(a); err != nil {
				p.add("redis-sentinel-addrs", err)
			}
		}
	case serve:
		p.add("redis-url", errors.New("a Redis is required in serve mode: set --redis-url, or --redis-sentinel-master with --redis-sentinel-addrs"))
	}
	if c.RedisPasswordFile != "" {
		if err := checkFile(c.RedisPasswordFile); err != nil {
			p.add("redis-password-file", err)
		}
	}
	if strings.ContainsAny(c.RedisPrefix, "{} \t\n") {
		p.add("redis-prefix", fmt.Errorf("must not contain braces or whitespace (hash tags are added per key), got %q", c.RedisPrefix))
	}
}

// checkRedisURL checks a Redis URL without echoing its password.
func checkRedisURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("is not a valid URL (want redis://[user:password@]host:port[/db])")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return fmt.Errorf("must start with redis:// or rediss://, got %q", u.Scheme+"://")
	}
	if _, err := redis.ParseURL(raw); err != nil {
		return fmt.Errorf("%s is not a valid Redis URL (want redis://[user:password@]host:port[/db])", u.Redacted())
	}
	return nil
}

func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has no port number 0..65535", addr)
	}
	return nil
}

func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must not have a query or fragment", raw)
	}
	return nil
}

func checkFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cannot use %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// redactURL hides the password of a URL, for logs.
func redactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(not a URL)"
	}
	return u.Redacted()
}

// ErrEmbeddedRedis is returned by RedisOptions when no Redis is configured
// (dev mode): the caller runs an embedded one.
var ErrEmbeddedRedis = errors.New("config: no Redis configured; dev mode uses an embedded one")

// Default Redis client timeouts: a backstop behind the per-operation
// context deadlines that ContextTimeoutEnabled lets through.
const (
	RedisDialTimeout  = 5 * time.Second
	RedisReadTimeout  = 3 * time.Second
	RedisWriteTimeout = 3 * time.Second
)

// RedisOptions returns client options for the configured Redis: the URL's
// address, user, password, db and TLS, or the Sentinel master and addresses.
// The password file, when set, overrides any password. ContextTimeoutEnabled
// is set, with RedisDialTimeout/RedisReadTimeout/RedisWriteTimeout unless
// the URL sets its own. It returns ErrEmbeddedRedis when no Redis is
// configured, and an error when the URL does not parse or the password file
// cannot be read. Pass the result to redis.NewUniversalClient.
func (c Config) RedisOptions() (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		ContextTimeoutEnabled: true,
		DialTimeout:           RedisDialTimeout,
		ReadTimeout:           RedisReadTimeout,
		WriteTimeout:          RedisWriteTimeout,
	}
	switch {
	case c.RedisURL != "":
		if err := checkRedisURL(c.RedisURL); err != nil {
			return nil, fmt.Errorf("config: redis-url: %w", err)
		}
		p, err := redis.ParseURL(c.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("config: redis-url %s does not parse", redactURL(c.RedisURL))
		}
		o.Addrs = []string{p.Addr}
		o.ClientName = p.ClientName
		o.Protocol = p.Protocol
		o.Username, o.Password, o.DB = p.Username, p.Password, p.DB
		o.TLSConfig = p.TLSConfig
		if p.DialTimeout != 0 {
			o.DialTimeout = p.DialTimeout
		}
		if p.ReadTimeout != 0 {
			o.ReadTimeout = p.ReadTimeout
		}
		if p.WriteTimeout != 0 {
			o.WriteTimeout = p.WriteTimeout
		}
	case c.RedisSentinelMaster != "":
		o.MasterName = c.RedisSentinelMaster
		o.Addrs = slices.Clone(c.RedisSentinelAddrs)
	default:
		return nil, ErrEmbeddedRedis
	}
	if c.RedisPasswordFile != "" {
		s, err := ReadSecret(c.RedisPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("config: redis-password-file: %w", err)
		}
		o.Password = s.Reveal()
	}
	return o, nil
}
