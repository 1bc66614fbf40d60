// Package metrics is the broker's Prometheus instrumentation: one Broker
// value per process holds every series, registered on a registry the
// composition root passes in (no global default registry), and is served
// on the broker's separate metrics listener (--metrics-listen).
//
// The domain and lifecycle packages never import client_golang. Each
// declares the small interface it reports through (servers.Metrics,
// reconcile.Metrics, reclaim.Metrics, httpapi.Metrics, proxy.Metrics) and Broker
// implements them with plain arguments; the composition root
// (broker/internal/app) hands Broker in. Redis and Kubernetes call errors
// are counted at the clients: RedisHook is a go-redis hook, KubeTransport
// wraps the client-go transport. State that lives in Redis (servers by
// state, GPU allocation, node heartbeats) is copied in by SetFleet, which
// the composition root calls on a period; every replica exports the same
// fleet series, so dashboards take max by the series' own labels.
//
// Names follow Prometheus's conventions: the gpubroker_ namespace, base
// units in the name (_seconds, _bytes), _total for counters, and
// percentages named _percent where the node agent (limiter/agent) uses the
// same unit for the same quantity, so allocation and real use compare
// directly. The README's "Metrics" section lists every series.
//
// Invariants:
//   - No series carries a user name unless Options.UserLabels is set
//     (cardinality): per-user series are separate metrics (gpubroker_user_*),
//     so turning the option on never changes the labels of another series.
//   - Every label takes values from a fixed set or from the fleet's own
//     inventory (GPU uuids, node names, profile names, route templates),
//     never from request input: an unmatched route is "unmatched".
//   - Counters whose label values are known in advance (spawn outcomes,
//     refusal reasons, repair kinds, reclaim actions) start at zero, so a
//     rate over them exists before the first event.
//   - Broker's methods are safe for concurrent use.
package metrics
