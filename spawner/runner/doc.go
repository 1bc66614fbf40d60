// Package runner is a kubelet for machines without one: it runs the main
// container of every pod bound to its nodes as a local process and reports
// the process's state back as the pod's status. The e2e harness and dev mode
// use it so that notebook pods are real Jupyter servers, reachable at their
// pod IPs, whose crashes the broker sees as a real cluster would show them.
//
// What it does for each pod on one of its nodes (Config.Nodes), in the
// kubelet's order:
//
//   - assigns a pod IP from Config.CIDR (a loopback range by default, so a
//     process bound to it is reachable from this machine only) and marks the
//     pod scheduled and initialized;
//   - mounts the pod's hostPath volumes by mapping each path P to
//     Config.HostRoot+P (DirectoryOrCreate and FileOrCreate are created;
//     Directory and File must exist, else the container waits in
//     ContainerCreating with the reason, as the kubelet's FailedMount);
//   - builds the container's environment as the kubelet does: the image's
//     env (Config.Images), then envFrom (Secrets and ConfigMaps), then env
//     (values with $(VAR) expanded, fieldRef and secretKeyRef/configMapKeyRef
//     resolved); a missing Secret or key is CreateContainerConfigError;
//   - runs command/args with Kubernetes semantics (command replaces the
//     image's entrypoint, args its cmd, $(VAR) expanded, the executable
//     looked up in the container's PATH) in its own process group, with
//     HOME and the working directory in the pod's local directory under
//     Config.Dir, and output captured to a log file; an unknown image is
//     ErrImageNeverPull, an executable that cannot start is a StartError
//     (exit code 128) with the reason;
//   - where Config.Limiter is set and the container mounts the limiter
//     preload file (v1.PodPreload), runs the process through
//     Limiter.Wrap with the pod and the slice's quota and usage host
//     directories (the volumes mounted at v1.PodQuotaDir and
//     v1.PodUsageDir), so the real hook reads them at its fixed in-pod
//     paths; a container that does not mount it runs without the limiter.
//     limiter/hook/podhook is the real one (the production hook over the
//     stub driver, the slice laid out by the node agent's own code, the
//     process in podrun's mount namespace); the e2e tests wire it. This
//     package does not import it: the caller hands its Wrap and Env over;
//   - probes readiness (TCP socket or HTTP GET on the pod IP, every
//     min(periodSeconds, Config.ProbeInterval)); without a probe the
//     container is ready once started;
//   - on exit applies the restart policy: OnFailure and Always restart a
//     failed container, the first time at once and then after a back-off
//     that starts at Config.Backoff and doubles up to Config.MaxBackoff,
//     showing CrashLoopBackOff meanwhile; the terminated state carries the
//     exit code, the signal and, with terminationMessagePolicy
//     FallbackToLogsOnError, the last 80 lines (at most 2048 bytes) of the
//     output, as the kubelet does; a clean exit under OnFailure or Never ends
//     the pod as Succeeded, a failure under Never as Failed;
//   - when the pod is deleted gracefully, sends SIGTERM to the process group,
//     waits for min(terminationGracePeriodSeconds, Config.StopGrace), sends
//     SIGKILL, and removes the pod (a delete with grace 0 and the pod's UID
//     as precondition); a pod removed at once has its process killed.
//
// Nodes are registered (created if missing) and marked Ready when Run
// starts. No heartbeat is sent: nothing in the test cluster or in dev mode
// watches node leases.
//
// Limits: only the pod's first container runs (init containers and sidecars
// do not); probes other than TCP socket and HTTP GET count as passing; the
// process shares this machine's network and filesystem, so a container path
// other than the mapped volumes, HOME and the working directory means this
// machine's path. It is test and dev infrastructure: the processes run with
// this process's privileges.
//
// Invariants:
//   - Every process runs in its own process group; Run returns only after
//     each has been stopped (SIGTERM, then SIGKILL after the grace) and
//     reaped, and every goroutine it started has exited.
//   - Cached objects are never modified; status writes go through
//     UpdateStatus on a fresh copy with FieldManager, retried on conflict.
//   - A pod IP is held by one live pod at a time and released when its pod
//     is gone.
//   - Status reflects what happened: Ready only after a probe passed on the
//     current process; a terminated state only after the process was reaped.
package runner
