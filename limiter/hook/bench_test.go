package hook_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

var benchLine = regexp.MustCompile(`bench (\w+) direct_ns=([\d.]+) hooked_ns=([\d.]+) added_ns=(-?[\d.]+) ratio=([\d.]+)`)

// BenchmarkHookOverhead runs build/bench (the stub called directly and
// through the hook in one process) and reports, per hooked call, the
// direct and hooked ns, the ns added and the ratio. Run it with
// `go tool task limiter:bench` or `go test -run '^$' -bench . -benchtime 1x ./limiter/hook`.
func BenchmarkHookOverhead(b *testing.B) {
	for range b.N {
		dev := newDevice(b)
		f := dev.newSlice("s")
		dev.initialQuota(f, slice{MemoryMiB: 1024, ComputePercent: 50, ComputeLimitPercent: 50})
		cmd := exec.Command(filepath.Join(buildDir(), "podrun"), "-q", f.QuotaDir, "-u", f.UsageDir, filepath.Join(buildDir(), "bench"))
		cmd.Env = dev.env(true, nil)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("bench: %v\n%s", err, out)
		}
		b.Logf("%s", out)
		for _, m := range benchLine.FindAllStringSubmatch(string(out), -1) {
			for i, unit := range []string{"direct-ns", "hooked-ns", "added-ns", "ratio"} {
				v, err := strconv.ParseFloat(m[2+i], 64)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(v, m[1]+"-"+unit)
			}
		}
	}
}
