package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// RedisHook returns a go-redis hook that counts the commands sent in
// gpubroker_redis_commands_total and the failed ones in
// gpubroker_redis_errors_total, by command name. A missing key (redis.Nil),
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
	h.b.redisCmds.WithLabelValues(name).Inc()
	if err == nil || name == "hello" || name == "client" || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) || strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return
	}
	h.b.redisErrs.WithLabelValues(name).Inc()
}

// KubeTransport wraps the Kubernetes client's transport (rest.Config's
// WrapTransport) so that every request is counted in
// gpubroker_kubernetes_requests_total by method, and failed ones in
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
	t.b.kubeReqs.WithLabelValues(r.Method).Inc()
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

// RedisPool is what CollectRedisPool reads of a Redis client: its pool's
// statistics (every go-redis client has them).
type RedisPool interface{ PoolStats() *redis.PoolStats }

// CollectRedisPool adds the connection pool of client, named pool (a fixed
// name: "main", "streams"), to the series read at each scrape:
// gpubroker_redis_pool_connections by state (idle, in_use),
// gpubroker_redis_pool_waits_total (gets that found no idle connection
// and waited for one), gpubroker_redis_pool_wait_seconds_total (the time
// they waited) and gpubroker_redis_pool_timeouts_total (gets that gave up
// waiting), each by pool. Call it once per client.
func (b *Broker) CollectRedisPool(pool string, client RedisPool) {
	b.pools.mu.Lock()
	defer b.pools.mu.Unlock()
	b.pools.pools = append(b.pools.pools, namedPool{pool, client})
}

type namedPool struct {
	name   string
	client RedisPool
}

// poolSeries is an unchecked collector of the pools CollectRedisPool added.
type poolSeries struct {
	mu    sync.Mutex
	pools []namedPool
}

var (
	poolConns = prometheus.NewDesc(Namespace+"_redis_pool_connections",
		"Connections in this replica's Redis client pool, by pool (main, streams) and state (idle, in_use).", []string{"pool", "state"}, nil)
	poolWaits = prometheus.NewDesc(Namespace+"_redis_pool_waits_total",
		"Commands that found no idle connection in the pool and waited for one, by pool.", []string{"pool"}, nil)
	poolWaitTime = prometheus.NewDesc(Namespace+"_redis_pool_wait_seconds_total",
		"Time commands waited for a pool connection, seconds, by pool.", []string{"pool"}, nil)
	poolTimeouts = prometheus.NewDesc(Namespace+"_redis_pool_timeouts_total",
		"Commands that gave up waiting for a pool connection, by pool.", []string{"pool"}, nil)
)

// Describe sends nothing: the pools are added after registration.
func (p *poolSeries) Describe(chan<- *prometheus.Desc) {}

func (p *poolSeries) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	pools := append([]namedPool(nil), p.pools...)
	p.mu.Unlock()
	for _, np := range pools {
		st := np.client.PoolStats()
		if st == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.IdleConns), np.name, "idle")
		ch <- prometheus.MustNewConstMetric(poolConns, prometheus.GaugeValue, float64(st.TotalConns)-float64(st.IdleConns), np.name, "in_use")
		ch <- prometheus.MustNewConstMetric(poolWaits, prometheus.CounterValue, float64(st.WaitCount), np.name)
		ch <- prometheus.MustNewConstMetric(poolWaitTime, prometheus.CounterValue, float64(st.WaitDurationNs)/1e9, np.name)
		ch <- prometheus.MustNewConstMetric(poolTimeouts, prometheus.CounterValue, float64(st.Timeouts), np.name)
	}
}
