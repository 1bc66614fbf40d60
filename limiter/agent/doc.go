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
//   - slices: as soon as the pod watcher sees a new pod (PodIndex.Changed),
//     and at every QuotaResync, each local slice's host directory is laid
//     out (PrepareSlice, also used by the pod runner's limiter
//     limiter/hook/podhook): <root>/slices/<id>/quota and .../usage at mode
//     0755 and root's, the usage region created initialized at mode 0666,
//     and, when no valid quota file is there, the pod's initial slice (its
//     annotations) written as the first one, with the slice's GPU. The hook
//     reads nothing else, so this normally happens before the container
//     starts (the hook waits up to 5 s for it).
//   - live quotas: each local slice's desired quota (agentstore) is written
//     into its quota file with a higher generation (region.WriteQuota,
//     atomic rename) when it differs, and the applied generation is
//     recorded; on every pub/sub notification and every QuotaResync.
//   - pace feed: every PaceInterval (100 ms), each slice's and each GPU's
//     SM use, measured through NVML with host pids, into the slice's usage
//     region (region.WriteAgentSample); inside a pod's pid namespace the
//     hook cannot match NVML's pids to its own and paces by these samples.
//   - enforcement (Policy; by default ModeKill, which protects the GPU's
//     other tenants): a slice whose NVML memory exceeds its cap by more than
//     the tolerance for Samples consecutive samples (its largest process,
//     "over-memory"), a GPU process of a slice's pod that has no slot in the
//     slice's usage region (it reached the GPU past the hook, "hidden"), and
//     a GPU process in a pod of no slice past the orphan grace ("no-slice")
//     are stopped; the host's own processes are only reported, and so is
//     a usage region that was replaced, removed or made unusable
//     ("usage-tampered"; once removed, no later file counts as the agent's).
//     A slice whose NVML SM use exceeds its burst ceiling
//     (computeLimitPercent) by more than ComputeTolerancePoints for Samples,
//     and at least 10, consecutive samples is judged apart ("over-compute",
//     its busiest process) under ComputeMode, report by default: the pace
//     feed lives in the tenant-writable usage region, so pacing alone does
//     not hold a hostile tenant, and the hook paces launches, not kernels.
//     Every decision is an audit record (agentstore), which names the
//     server; the broker tells the server's events and page. ModeReport
//     only reports.
//   - Xid events, where the library has the event API: a critical,
//     non-application Xid marks only its GPU unhealthy.
//
// # Invariants
//
//   - The agent's NVML view is the authority (ARCHITECTURE.md invariant 3): the
//     usage region is read for the last kernel time and to tell which of a
//     pod's GPU processes went through the hook (a slot), and maps pids to
//     slices only with Config.TrustUsagePIDs, for processes outside any pod
//     cgroup. The usage file first seen is remembered (device, inode); one
//     that is not that file any more, or not a regular file of the right
//     size, is not read, and the reason goes into the slice's samples.
//   - Every file the agent opens under the host root is opened without
//     blocking or following a symbolic link (limiter/region); what a tenant
//     planted there is reported, never used.
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
