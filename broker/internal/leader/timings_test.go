package leader_test

import (
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/leader"
)

// TestTimingsStopACutOffHolderBeforeATakeover checks, for every lease from
// the least allowed to a minute in 100 ms steps, that a cut-off holder
// stops leading (retry + renewDeadline after its last renewal) at least a
// tenth of the lease before the earliest takeover (floor(lease) − 1 s
// after it), and that client-go accepts the timings (LeaseDuration >
// RenewDeadline > 1.2 × RetryPeriod).
func TestTimingsStopACutOffHolderBeforeATakeover(t *testing.T) {
	if rd, rp := leader.Timings(15 * time.Second); rd != 10*time.Second || rp != 2*time.Second {
		t.Errorf("Timings(15s) = %v, %v; want client-go's 10s, 2s", rd, rp)
	}
	for lease := leader.MinLeaseDuration; lease <= time.Minute; lease += 100 * time.Millisecond {
		rd, rp := leader.Timings(lease)
		stops := rp + rd
		takeover := lease.Truncate(time.Second) - time.Second
		if stops+lease/10 > takeover {
			t.Errorf("lease %v: a cut-off holder leads until %v after its last renewal, a takeover may come at %v", lease, stops, takeover)
		}
		if !(lease > rd && rd > rp*12/10) {
			t.Errorf("lease %v: renew deadline %v, retry %v; client-go wants lease > renew deadline > 1.2 × retry", lease, rd, rp)
		}
	}
}
