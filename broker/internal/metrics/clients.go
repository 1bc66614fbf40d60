package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RedisHook returns a go-redis hook that counts failed commands in
// gpubroker_redis_errors_total by command name. A missing key (redis.Nil),
// a script not cached yet (NOSCRIPT, which go-redis answers by sending the
// script), a caller that gave up (context.Canceled) and the handshake
// go-redis sends on every new connection (HELLO, CLIENT SETINFO, which
// Redis before 7.2 refuses and go-redis ignores) are not errors of Redis.
// Add it to every client of the broker (AddHook).
func (b *Broker) RedisHook() redis.Hook { return redisHook{b} }

type redisHook struct{ b *Broker }

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil && !errors.Is(err, context.Canceled) {
			h.b.redisErrs.WithLabelValues("dial").Inc()
		}
		return c, err
	}
}

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd.Name(), err)
		return err
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.count(c.Name(), c.Err())
		}
		return err
	}
}

func (h redisHook) count(name string, err error) {
	name = strings.ToLower(name)
	if err == nil || name == "hello" || name == "client" || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) || strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return
	}
	h.b.redisErrs.WithLabelValues(name).Inc()
}

// KubeTransport wraps the Kubernetes client's transport (rest.Config's
// WrapTransport) so that failed requests are counted in
// gpubroker_kubernetes_request_errors_total: answers 429 and 5xx by method
// and code, and requests without an answer as code "none" (unless the
// caller gave up).
func (b *Broker) KubeTransport(rt http.RoundTripper) http.RoundTripper {
	return kubeTransport{b: b, next: rt}
}

type kubeTransport struct {
	b    *Broker
	next http.RoundTripper
}

func (t kubeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	switch {
	case err != nil:
		if !errors.Is(err, context.Canceled) {
			t.b.kubeErrs.WithLabelValues(r.Method, "none").Inc()
		}
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		t.b.kubeErrs.WithLabelValues(r.Method, strconv.Itoa(resp.StatusCode)).Inc()
	}
	return resp, err
}
