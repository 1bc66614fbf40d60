package cliconfig

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is how a binary reaches Redis: one URL, or a Sentinel master and its
// Sentinels; a password file; the key prefix shared by broker and agents.
type Redis struct {
	// URL is redis://[user:password@]host:port[/db], or rediss:// for TLS.
	URL string
	// SentinelMaster and SentinelAddrs (host:port each) select Sentinel
	// instead of URL.
	SentinelMaster string
	SentinelAddrs  []string
	// PasswordFile holds the password; it overrides one in URL. "" = none.
	PasswordFile string
	// Prefix starts every key. Default "gpubroker:".
	Prefix string
}

// DefaultRedisPrefix is the default key prefix of broker and agents.
const DefaultRedisPrefix = "gpubroker:"

// Redis client timeouts: a backstop behind the per-operation context
// deadlines, which ContextTimeoutEnabled lets reach the socket.
const (
	RedisDialTimeout  = 5 * time.Second
	RedisReadTimeout  = 3 * time.Second
	RedisWriteTimeout = 3 * time.Second
)

// ErrNoRedis is returned by Redis.Options when neither a URL nor Sentinel
// is configured (gpubroker-dev then embeds one).
var ErrNoRedis = errors.New("no Redis configured")

// RedisRequirement says whether a binary needs a Redis configured.
type RedisRequirement struct {
	// Required makes a missing Redis a problem; Why follows "is required"
	// in its message (" in serve mode").
	Required bool
	Why      string
	// URLDefault is --redis-url's default as the help and README show it.
	URLDefault string
}

// Flags returns the Redis flags bound to r: --redis-url,
// --redis-sentinel-master, --redis-sentinel-addrs, --redis-password-file
// and --redis-prefix, with their checks.
func (r *Redis) Flags(req RedisRequirement) []Flag {
	sentinel := func() bool { return r.SentinelMaster != "" || len(r.SentinelAddrs) > 0 }
	return []Flag{
		{Name: "redis-url", Placeholder: "URL", Value: String(&r.URL), DefaultDoc: req.URLDefault,
			Help:   "Redis to use: redis://[user:password@]host:port[/db], or rediss:// for TLS.",
			Redact: RedactURL,
			Check: func() error {
				switch {
				case r.URL != "" && sentinel():
					return errors.New("set either --redis-url or the Sentinel pair (--redis-sentinel-master, --redis-sentinel-addrs), not both")
				case r.URL != "":
					return checkRedisURL(r.URL)
				case !sentinel() && req.Required:
					return fmt.Errorf("a Redis is required%s: set --redis-url, or --redis-sentinel-master with --redis-sentinel-addrs", req.Why)
				}
				return nil
			}},
		{Name: "redis-sentinel-master", Placeholder: "NAME", Value: String(&r.SentinelMaster),
			Help: "Redis Sentinel master name (instead of --redis-url).",
			Check: func() error {
				if r.URL == "" && r.SentinelMaster == "" && len(r.SentinelAddrs) > 0 {
					return errors.New("is required with --redis-sentinel-addrs")
				}
				return nil
			}},
		{Name: "redis-sentinel-addrs", Placeholder: "LIST", Value: List(&r.SentinelAddrs),
			Help: "Comma-separated Redis Sentinel addresses, host:port.",
			Check: func() error {
				if r.URL != "" {
					return nil
				}
				if r.SentinelMaster != "" && len(r.SentinelAddrs) == 0 {
					return errors.New("is required with --redis-sentinel-master")
				}
				var errs []error
				for _, a := range r.SentinelAddrs {
					errs = append(errs, CheckHostPort(a))
				}
				return errors.Join(errs...)
			}},
		{Name: "redis-password-file", Placeholder: "PATH", Value: String(&r.PasswordFile),
			Help:  "File holding the Redis password (it overrides one in the URL).",
			Check: func() error { return checkOptionalFile(r.PasswordFile) }},
		{Name: "redis-prefix", Placeholder: "PREFIX", Value: String(&r.Prefix), Default: DefaultRedisPrefix,
			Help: "Prefix of every Redis key; the broker's and the agents' must be equal.",
			Check: func() error {
				if strings.ContainsAny(r.Prefix, "{} \t\n") {
					return fmt.Errorf("must not contain braces or whitespace (hash tags are added per key), got %q", r.Prefix)
				}
				return nil
			}},
	}
}

// Options returns client options for the configured Redis: the URL's
// address, user, password, db, TLS and timeouts, or the Sentinel master and
// addresses. The password file, when set, overrides any password.
// ContextTimeoutEnabled is set, with RedisDialTimeout, RedisReadTimeout and
// RedisWriteTimeout unless the URL sets its own. Errors: ErrNoRedis when
// nothing is configured, a URL that does not parse (its password never
// shown), an unreadable password file.
func (r Redis) Options() (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		ContextTimeoutEnabled: true,
		DialTimeout:           RedisDialTimeout,
		ReadTimeout:           RedisReadTimeout,
		WriteTimeout:          RedisWriteTimeout,
	}
	switch {
	case r.URL != "":
		if err := checkRedisURL(r.URL); err != nil {
			return nil, fmt.Errorf("redis-url: %w", err)
		}
		p, err := redis.ParseURL(r.URL)
		if err != nil {
			return nil, fmt.Errorf("redis-url %s does not parse", RedactURL(r.URL))
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
	case r.SentinelMaster != "":
		o.MasterName = r.SentinelMaster
		o.Addrs = slices.Clone(r.SentinelAddrs)
	default:
		return nil, ErrNoRedis
	}
	if r.PasswordFile != "" {
		s, err := ReadSecret(r.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("redis-password-file: %w", err)
		}
		o.Password = s.Reveal()
	}
	return o, nil
}

// Client returns a client for the configured Redis (Options' errors); the
// caller closes it.
func (r Redis) Client() (redis.UniversalClient, error) {
	o, err := r.Options()
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(o), nil
}

// Where names the configured Redis for messages, without a password:
// the redacted URL, or "sentinel master <name> at <addrs>".
func (r Redis) Where() string {
	if r.URL != "" {
		return RedactURL(r.URL)
	}
	return fmt.Sprintf("sentinel master %s at %s", r.SentinelMaster, strings.Join(r.SentinelAddrs, ","))
}

// Dependency is the --connect check of this Redis: a client of its own
// sends PING and must get PONG.
func (r Redis) Dependency() Dependency {
	return Dependency{Name: "redis", Where: r.Where(), Check: func(ctx context.Context) error {
		c, err := r.Client()
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("PING: %w", err)
		}
		return nil
	}}
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

// CheckHostPort reports whether addr is host:port with a port 0..65535.
func CheckHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has no port number 0..65535", addr)
	}
	return nil
}

// checkOptionalFile is CheckFile for a path that may be "".
func checkOptionalFile(path string) error {
	if path == "" {
		return nil
	}
	return CheckFile(path)
}
