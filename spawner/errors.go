package spawner

import "errors"

// Sentinel errors. Callers test them with errors.Is; the wrapping error
// carries a readable message.
var (
	// ErrInvalid marks a Spec or environment the spawner cannot turn into a
	// pod (bad quantity, empty image, reserved env name...). Terminal.
	ErrInvalid = errors.New("spawner: invalid spec")
	// ErrNotSynced is returned by reads before the informer cache has synced.
	// Retryable.
	ErrNotSynced = errors.New("spawner: cache not synced")
	// ErrPodExists is returned by Client.Create when the server's pod name is
	// taken by a pod of another spawn (usually one still terminating).
	// Retryable once that pod is gone.
	ErrPodExists = errors.New("spawner: pod of another spawn exists")
	// ErrRejected is returned when the API server refuses an object for good
	// (validation 422, or an admission 403 such as a ResourceQuota or
	// PodSecurity denial; not the authorizer's 403, see Transient).
	// Terminal for this spawn.
	ErrRejected = errors.New("spawner: rejected by the cluster")
	// ErrUnavailable is returned (wrapped) when the Kubernetes API server
	// did not answer a request: no connection, a timeout, or an answer
	// that says "not now" (500, 503, 504, 429, the authorizer's 403 after
	// a restart; see Transient), also after the spawner's retries.
	// Retryable; a write that failed so may or may not have taken effect.
	ErrUnavailable = errors.New("spawner: the Kubernetes API server is not answering")
	// ErrNotOwned is returned when an object with the name the spawner wants
	// exists but is not managed by gpubroker; the spawner never touches it.
	ErrNotOwned = errors.New("spawner: object not managed by gpubroker")
	// ErrNoToken is returned by Client.NotebookToken when the spawn's Secret
	// is missing, belongs to another spawn or holds no notebook token.
	ErrNoToken = errors.New("spawner: no notebook token for this spawn")
)
