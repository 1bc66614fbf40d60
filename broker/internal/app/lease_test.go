package app

import (
	"testing"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/leader"
)

// TestTheLeastLeaseIsOneTimingsCovers: --lease-duration's minimum (config)
// is the shortest lease leader.Timings keeps a cut-off holder clear of a
// takeover for.
func TestTheLeastLeaseIsOneTimingsCovers(t *testing.T) {
	if config.MinLeaseDuration != leader.MinLeaseDuration {
		t.Errorf("--lease-duration accepts %v and up, leader.Timings is defined from %v", config.MinLeaseDuration, leader.MinLeaseDuration)
	}
}
