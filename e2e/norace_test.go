//go:build !race

package e2e

// raceEnabled is true when the test binary runs with the race detector; the
// gpubroker binary under test is then built with -race too.
const raceEnabled = false
