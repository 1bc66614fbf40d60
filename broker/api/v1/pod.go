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
)

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
)

// Paths on the node under the configurable host root (default /var/lib/gpubroker).
const (
	HostHookSubdir   = "hook"   // <root>/hook/libgpulimit.so and <root>/hook/ld.so.preload
	HostSlicesSubdir = "slices" // <root>/slices/<sliceID>/quota and .../usage
	QuotaFileName    = "quota.bin"
	UsageFileName    = "usage.bin"
)
