// Package agent is gpubroker-agent's library: what the node agent does on a
// GPU node with an injected nvml.Interface (github.com/NVIDIA/go-nvml).
//
// Agent.Run initializes NVML, discovers the GPUs (Discover, plus MIG mode
// where the library has it) and then runs, until its context ends:
//
//   - heartbeat: the node report (every GPU with health and reason) into
//     Redis every HeartbeatInterval and at once when a GPU's health changes
//     (agentstore.Store.Heartbeat). The broker registers GPUs from the
//     reports (agentstore.Store.Inventory) and marks the GPUs of a node
//     whose report went stale unhealthy.
//   - sampling: every SampleInterval, per GPU, the running compute
//     processes (memory) and their utilization samples (SM %) from NVML;
//     each pid is mapped to its pod through /proc/<pid>/cgroup (cgroup v1
//     and v2, cgroupfs and systemd drivers) and the pod to its slice through
//     the pod's annotations (PodWatcher: an informer on this node's
//     gpubroker pods); the slice's last kernel time comes from its usage
//     region. One sample per local slice goes to Redis in one pipeline.
//   - live quotas: each local slice's desired quota (agentstore) is written
//     into its quota file with a higher generation (region.WriteQuota,
//     atomic rename) when it differs, and the applied generation is
//     recorded; on every pub/sub notification and every QuotaResync.
//   - pace feed: every PaceInterval (100 ms), each slice's and each GPU's
//     SM use, measured through NVML with host pids, into the slice's usage
//     region (region.WriteAgentSample); inside a pod's pid namespace the
//     hook cannot match NVML's pids to its own and paces by these samples.
//   - enforcement: a slice whose NVML memory exceeds its cap by more than
//     the tolerance for Samples consecutive samples, and a GPU process in no
//     slice, are reported or killed (Policy), always with an audit record.
//   - Xid events, where the library has the event API: a critical,
//     non-application Xid marks only its GPU unhealthy.
//
// # Invariants
//
//   - The agent's NVML view is the authority (ARCHITECTURE.md invariant 3): the
//     usage region is read for the last kernel time only, and maps pids to
//     slices only with Config.TrustUsagePIDs, for processes outside any pod
//     cgroup.
//   - Missing data is missing, never zero (invariant 4): an NVML query that
//     fails or is not supported leaves the sample's field nil with the reason
//     in Sample.Missing; a process list that NVML returned empty is a
//     measured zero.
//   - A lost GPU (ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, or a critical
//     Xid) is marked unhealthy alone; the other GPUs keep serving. It stays
//     unhealthy until the agent restarts (recovery needs a GPU reset).
//   - A pid is named by (pid, start time) everywhere, so a reused pid is
//     never mistaken for its previous owner, and kills go through a pidfd
//     after checking the start time.
//   - NVML functions that the loaded library does not export are never
//     called (Deps.HasSymbol); the test stub and older drivers lack some.
//
// # Time
//
// Sample times, report times and audit times come from the injected Clock;
// tests drive the loops with a fake one.
//
// # Concurrency
//
// Run owns every goroutine it starts and returns after they have ended.
// The sampling state (process cache, enforcement counts) belongs to the
// sampling goroutine; device health and quota state are guarded by mutexes.
package agent
