package v1

// Labels every notebook pod carries. Values are slugs (see spawner.Slug).
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "gpubroker"
	LabelUser      = "gpubroker.io/user"
	LabelServer    = "gpubroker.io/server"
	LabelSpawnID   = "gpubroker.io/spawn-id"
)

// Annotations every notebook pod carries: the durable record of its slice
// (ARCHITECTURE.md invariant 2). Numbers are base-10 integers.
const (
	AnnotationUser                = "gpubroker.io/user"   // raw user name
	AnnotationServer              = "gpubroker.io/server" // raw server name
	AnnotationProfile             = "gpubroker.io/profile"
	AnnotationSpawnID             = "gpubroker.io/spawn-id"
	AnnotationGPUUUID             = "gpubroker.io/gpu-uuid"
	AnnotationNode                = "gpubroker.io/node"
	AnnotationMemoryMiB           = "gpubroker.io/memory-mib"
	AnnotationComputePercent      = "gpubroker.io/compute-percent"
	AnnotationComputeLimitPercent = "gpubroker.io/compute-limit-percent"
	AnnotationGroups              = "gpubroker.io/quota-groups" // comma-separated raw group names charged
	// AnnotationSliceRestored is written (RFC 3339 time) by the reconciler
	// on a pod whose slice it restores into Redis, before it reads the
	// slice: the write changes the pod's resourceVersion, which fences off
	// a resize that changed Redis before the restore and would otherwise
	// record its slice on the pod after it (ARCHITECTURE.md, Resize).
	AnnotationSliceRestored = "gpubroker.io/slice-restored"
	// AnnotationSharing is the server's sharing mode (SharingMode); absent
	// on pods made before sharing modes existed, which are sliced.
	AnnotationSharing = "gpubroker.io/sharing"
	// AnnotationMIGProfile is a MIG server's MIG profile, e.g. "3g.71gb".
	AnnotationMIGProfile = "gpubroker.io/mig-profile"
	// AnnotationParentUUID is a MIG server's physical GPU.
	AnnotationParentUUID = "gpubroker.io/parent-uuid"
	// AnnotationIdempotencyKey is the Idempotency-Key of the create that
	// started the spawn (absent when none): a record rebuilt from the pod
	// after Redis lost it still answers that key's retry.
	AnnotationIdempotencyKey = "gpubroker.io/idempotency-key"
)

// FinalizerServerRecord is the finalizer every notebook pod is created
// with: a pod deleted by anyone (its user through the broker, an
// eviction, its node's deletion, kubectl) stays, terminating, until the
// broker has recorded how its server ended (the record moved to stopped or
// failed, or rebuilt from the pod as stopped or failed when Redis had lost
// it), and only then does the broker remove it (ARCHITECTURE.md invariant
// 2). The idea is the Job controller's batch.kubernetes.io/job-tracking.
const FinalizerServerRecord = "gpubroker.io/server-record"

// LabelSharing is the node label that sets the sharing mode of every GPU
// of a node (sliced, exclusive or mps; MIG follows the GPU's own MIG mode).
// An admin's per-GPU mode (PUT /api/v1/admin/gpus/{uuid}/mode) wins.
const LabelSharing = "gpubroker.io/sharing"

// EnvLogLevel is the one variable the limiter hook reads: how much it says
// on stderr (error|warn|info|debug; default warn). Nothing in the
// environment sets a limit or names a file: the environment belongs to the
// notebook user (ARCHITECTURE.md invariant 3), and the hook reads its slice
// only from PodQuotaFile and PodUsageFile.
const EnvLogLevel = "GPUBROKER_LIMITER_LOG"

// Environment every notebook pod gets for starting its notebook server.
const (
	// EnvPodIP is the pod's IP (downward API status.podIP), for a notebook
	// command that must bind it rather than 0.0.0.0 (the pod runner's
	// notebooks share one machine's network).
	EnvPodIP = "GPUBROKER_POD_IP"
	// EnvBaseURL is the path the notebook is served under through the
	// broker's proxy, "/user/<user slug>/<server slug>/" (always with both
	// slashes), for the notebook's base_url option.
	EnvBaseURL = "GPUBROKER_BASE_URL"
	// EnvNotebookToken holds the spawn's notebook token, in the server's
	// Secret only (never plain pod env). Jupyter servers read it as their
	// token; the broker's proxy sends it on every proxied request, so the
	// browser never sees it.
	EnvNotebookToken = "JUPYTER_TOKEN"
)

// Paths inside the notebook pod; the hook's fixed paths are PodQuotaFile
// and PodUsageFile (equal to limiter/hook/include/gpulimit_region.h, tested).
const (
	PodHookDir   = "/usr/local/lib/gpubroker" // read-only, holds libgpulimit.so
	PodHookLib   = "/usr/local/lib/gpubroker/libgpulimit.so"
	PodPreload   = "/etc/ld.so.preload"       // read-only, names PodHookLib
	PodQuotaDir  = "/var/run/gpubroker/quota" // read-only: the hook uses a quota file only on a read-only mount
	PodQuotaFile = "/var/run/gpubroker/quota/quota.bin"
	PodUsageDir  = "/var/run/gpubroker/usage" // read-write (mapped by the hooks); the host directory is root's, 0755
	PodUsageFile = "/var/run/gpubroker/usage/usage.bin"
	// PodMPSPipeDir is where an MPS pod finds its GPU's MPS pipe directory:
	// the MPS clients' default (so no variable names it), mounted
	// read-only (clients connect to its sockets; they write nothing there).
	PodMPSPipeDir = "/tmp/nvidia-mps"
	// PodMPSShmDir is the shared memory an MPS client shares with its
	// server.
	PodMPSShmDir = "/dev/shm"
)

// Paths on the node under the configurable host root (default /var/lib/gpubroker).
const (
	HostHookSubdir   = "hook"   // <root>/hook/libgpulimit.so and <root>/hook/ld.so.preload
	HostSlicesSubdir = "slices" // <root>/slices/<sliceID>/quota and .../usage
	// HostMPSSubdir holds the MPS control daemons' directories:
	// <root>/mps/<gpu uuid>/{pipe,log} per MPS-mode GPU and <root>/mps/shm,
	// the node's MPS shared memory.
	HostMPSSubdir = "mps"
	QuotaFileName = "quota.bin"
	UsageFileName = "usage.bin"
)
