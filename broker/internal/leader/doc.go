// Package leader runs work on exactly one broker replica at a time: Run
// campaigns for a Kubernetes Lease (client-go's leaderelection with a
// LeaseLock) and runs the work while this replica holds it. The
// composition root (broker/internal/app) uses it for the idle reclaimer
// and the reconciler's periodic passes;
// the reclaim domain itself knows nothing of Kubernetes.
//
// Invariants:
//
//   - Two replicas never run the work at once: the elector's context is
//     stopped only after the work has returned, and the Lease is released
//     (ReleaseOnCancel) only then, so another replica takes over within
//     RetryPeriod instead of LeaseDuration. A holder cut off from the API
//     server (not stopped) stops leading before another may take the
//     Lease over when RenewDeadline and RetryPeriod come from Timings.
//   - Run waits for the work and for its own goroutines before it returns.
package leader
