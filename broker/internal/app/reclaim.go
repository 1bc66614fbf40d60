package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/leader"
	"github.com/gpubroker/gpubroker/broker/internal/proxy"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/spawner"
)

// newReclaimer builds the idle reclaimer over the parts: idle states and
// audit in Redis, the agents' samples through agentstore, events through
// the store, stops through the lifecycle, shrinks through the resize
// service, the notebook proxy's activity from Redis, probes of each
// notebook under its own path prefix with its spawn's token (the hub API
// token for notebooks the hub started) and, with --hub-url, activity
// posted to the hub.
func newReclaimer(cfg config.Config, log *slog.Logger, p *parts, policies *reclaim.Policies, audit *redisstore.AuditLog) (*reclaim.Reclaimer, error) {
	token, err := cfg.HubAPIToken()
	if err != nil {
		return nil, err
	}
	hubClient := &http.Client{Timeout: 10 * time.Second}
	if token != "" {
		hubClient.Transport = tokenTransport{token: token.Reveal(), base: http.DefaultTransport}
	}
	var hub reclaim.HubNotifier
	if cfg.HubURL != "" {
		h, err := reclaim.NewHub(cfg.HubURL, token.Reveal(), hubClient)
		if err != nil {
			return nil, err
		}
		hub = h
	}
	svc := p.service
	return reclaim.New(reclaim.Config{
		Policies: policies, Audit: audit, States: redisstore.NewReclaim(p.redis, cfg.Redis.Prefix),
		Samples: redisstore.AgentSamples{Agents: p.agents}, Servers: p.store, Stopper: svc,
		Shrinker: reclaim.ShrinkFunc(func(ctx context.Context, srv fleet.Server, cp, cl int) error {
			// The spawn the cycle judged, with the memory it has then.
			_, err := svc.ResizeCompute(ctx, srv.ServerKey, srv.SpawnID, cp, cl, reclaim.ActorOf)
			return err
		}),
		Prober: reclaim.NewProber(&http.Client{Timeout: 10 * time.Second}, 5*time.Second, notebookTarget(p.spawner)),
		Hub:    hub, Proxy: redisstore.NewNotebooks(p.redis, cfg.Redis.Prefix), ProxyFresh: 3 * proxy.DefaultActivityFlush,
		Interval: cfg.ReclaimInterval, Log: log, Metrics: p.metrics,
	})
}

// notebookTarget locates a running server's notebook API for the probe:
// its pod's URL under the notebook's own path prefix, with the spawn's
// notebook token, or, for a notebook JupyterHub started, the API token the
// hub gave that server (its own user's servers only; the hub's API token, which
// reaches every hub server, is never sent to a notebook: the tenant runs
// the process that would receive it). The joined address must stay on the
// pod's host.
func notebookTarget(sp *spawner.Client) reclaim.Target {
	return func(ctx context.Context, s fleet.Server) (string, string, error) {
		prefix, hub, ok := sp.NotebookPrefix(s.User, s.Name, s.SpawnID)
		if !ok {
			return "", "", errors.New("the notebook's pod is not in the broker's cache, or its path prefix is not a plain path")
		}
		base := strings.TrimSuffix(s.URL, "/") + prefix
		pod, err1 := url.Parse(s.URL)
		joined, err2 := url.Parse(base)
		if err1 != nil || err2 != nil || joined.Host != pod.Host || joined.User != nil {
			return "", "", fmt.Errorf("the notebook's address %q does not stay on its pod's host", base)
		}
		token := sp.NotebookToken
		if hub {
			token = sp.HubServerToken
		}
		tok, err := token(ctx, s.User, s.Name, s.SpawnID)
		if err != nil {
			return "", "", fmt.Errorf("the notebook's token: %w", err)
		}
		return base, tok, nil
	}
}

var _ reclaim.Stopper = (*servers.Service)(nil)

// runReclaimer runs the reclaimer, and has the reconciler make its
// periodic passes (reconcile.Reconciler.SetLeading) and this replica apply
// the pod events (forwardPodEvents), while this replica
// holds the Lease, or always when no Lease namespace is configured (one
// replica only).
func runReclaimer(ctx context.Context, cfg config.Config, p *parts) error {
	if cfg.LeaderElectionNamespace == "" {
		p.log.Warn("reclaimer runs without leader election; run one replica only", "reclaim_interval", cfg.ReclaimInterval)
		p.metrics.SetLeader(true)
		defer p.metrics.SetLeader(false)
		return p.reclaimer.Run(ctx)
	}
	id, err := leaseIdentity()
	if err != nil {
		return err
	}
	renew, retry := leader.Timings(cfg.LeaseDuration)
	return leader.Run(ctx, leader.Config{
		Client: p.kube, Namespace: cfg.LeaderElectionNamespace, Name: cfg.LeaseName, Identity: id,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: renew, RetryPeriod: retry,
		OnLeader: func(leading bool) {
			p.metrics.SetLeader(leading)
			p.leading.Store(leading) // before the pass that replays the pods' phases
			p.reconciler.SetLeading(leading)
			p.log.Info("reclaimer, reconciler and pod events leadership", "leading", leading, "identity", id)
		},
	}, p.reclaimer.Run)
}

// leaseIdentity names this process in the Lease: the host name (the pod's
// name in a cluster) and a random suffix, as client-go's components do, so
// that two processes on one host (or a restarted one whose old holder
// record is still in the Lease) are never taken for each other.
func leaseIdentity() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("reclaimer identity: %w", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return host + "_" + hex.EncodeToString(b[:]), nil
}

// tokenTransport authenticates requests to JupyterHub with the broker's
// hub API token (never to a notebook server: notebookTarget).
type tokenTransport struct {
	token string
	base  http.RoundTripper
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "token "+t.token)
	return t.base.RoundTrip(r)
}
