package leader

import "time"

// MinLeaseDuration is the shortest lease Timings is defined for.
const MinLeaseDuration = 3 * time.Second

// Timings returns the RenewDeadline and RetryPeriod for a Lease of
// lease (≥ MinLeaseDuration) such that a holder cut off from the API
// server stops leading before another replica can take the Lease over:
//
//   - a holder renews every retry period and stops leading once it could
//     not renew for renewDeadline: at most retry + renewDeadline after the
//     RenewTime of its last renewal (client-go leaderelection's renew
//     loop, wait.Until over PollImmediateUntil);
//   - a candidate takes the Lease over LeaseDurationSeconds after it saw
//     the last renewal, and it compares records in whole seconds, so as
//     early as the last renewal's second plus LeaseDurationSeconds, which
//     is lease in whole seconds: floor(lease) − 1 s after that renewal at
//     worst (ha_test.go's takeover bound).
//
// retry is 2/15 of lease (client-go's 2 s of 15 s); renewDeadline is two
// thirds of lease (its 10 s of 15 s) or less, leaving a tenth of lease
// between the moment the holder stops and the earliest takeover, for the
// work to see its context end. The defaults come out as 10 s and 2 s.
func Timings(lease time.Duration) (renewDeadline, retry time.Duration) {
	retry = lease * 2 / 15
	earliest := lease.Truncate(time.Second) - time.Second
	return min(lease*2/3, earliest-retry-lease/10), retry
}
