// Package fleet is gpubroker's domain: GPUs, slices, allocations, placement
// policies, quotas, profiles and servers, with the sentinel and typed errors
// that the rest of the broker translates at its edges. It depends on the
// standard library and broker/api/v1 only.
//
// Invariants (ARCHITECTURE.md):
//   - No GPU is overcommitted: Σ slice MemoryMiB ≤ GPU MemoryMiB and
//     Σ ComputePercent ≤ 100, enforced atomically by the store.
//   - A slice is identified by its server's spawn id; everything that a late
//     event could touch is keyed by it.
package fleet
