// Package harness runs the real parts that gpubroker's end-to-end tests drive:
// etcd, kube-apiserver and kwok (built by `go tool task e2e:tools` into
// e2e/.bin), the gpubroker binary, and an HTTP client for the broker's public
// API (wire types from broker/api/v1).
//
// It only uses public interfaces: process command lines, the Kubernetes API
// through client-go and the broker's REST API. It never imports
// broker/internal.
//
// Invariants:
//   - Every process it starts runs in its own process group with its output in
//     a log file under the caller's directory; Stop sends SIGTERM to the group,
//     waits, then sends SIGKILL, and returns only after the process was reaped.
//   - Ports are ephemeral loopback ports chosen at start; nothing listens on a
//     fixed port.
//   - Waiting is polling with a deadline (Poll), or, where how long a wait
//     takes depends on the machine's load, with a limit on how long nothing
//     moves (PollProgress); never a fixed sleep.
package harness
