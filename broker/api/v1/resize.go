package v1

import "time"

// ResizeRequest is the body of PATCH /api/v1/users/{user}/servers/{name}/slice:
// the slice a running server should have. An absent field keeps the
// server's current value; when only ComputePercent is given and it exceeds
// the current ComputeLimitPercent, the limit is raised to it.
type ResizeRequest struct {
	// MemoryMiB is the new hard device-memory cap in MiB; > 0. It cannot go
	// below what the notebook's processes hold now.
	MemoryMiB *int64 `json:"memoryMiB,omitempty"`
	// ComputePercent is the new guaranteed SM share, 1..100.
	ComputePercent *int `json:"computePercent,omitempty"`
	// ComputeLimitPercent is the new burst ceiling, ComputePercent..100.
	ComputeLimitPercent *int `json:"computeLimitPercent,omitempty"`
}

// ResizeResult is the answer to a resize: 200 when the node agent has
// applied the new quota (the in-pod limiter follows within 100 ms), 202
// when it is pending.
type ResizeResult struct {
	// Server is the server after the resize; its slice is the new one.
	Server Server `json:"server"`
	// Slice is the slice now granted.
	Slice Slice `json:"slice"`
	// Generation is the desired-quota generation that carries Slice to the
	// node agent; it grows with every resize of the spawn.
	Generation int64 `json:"generation"`
	// Applied is true when the node agent acknowledged Generation.
	Applied bool `json:"applied"`
	// Deadline is, when pending, the time by which the node agent is
	// expected to apply it; absent when applied.
	Deadline *time.Time `json:"deadline,omitempty"`
}
