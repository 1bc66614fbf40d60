package stubtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// TestProgOnStub runs cudaprog on the stub driver, unhooked and hooked in a
// 1 GiB slice, and reads the memory total each one sees (a wider variable in
// the environment changes nothing).
func TestProgOnStub(t *testing.T) {
	stubtest.Need(t)
	env := append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+t.TempDir()+"/stub.state",
		"LD_LIBRARY_PATH="+stubtest.StubDir())
	plain := stubtest.Start(t, env)
	res, v := plain.Do("meminfo")
	if res != 0 || len(v) != 2 || v[1] != 81559<<20 {
		t.Fatalf("unhooked meminfo: CUresult %d %v, want 0 and the stub's 81559 MiB total", res, v)
	}
	if plain.Pid() <= 0 {
		t.Errorf("pid %d", plain.Pid())
	}

	dir := t.TempDir()
	for _, sub := range []string{"quota", "usage"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := region.CreateUsage(filepath.Join(dir, "usage", "usage.bin")); err != nil {
		t.Fatal(err)
	}
	if err := region.WriteQuota(filepath.Join(dir, "quota", "quota.bin"),
		region.Quota{SliceID: "s1", MemoryLimitBytes: 1024 << 20, ComputePercent: 50, ComputeLimitPercent: 50}); err != nil {
		t.Fatal(err)
	}
	hooked := stubtest.StartInSlice(t, append(append([]string{}, env...), "GPUBROKER_MEMORY_LIMIT_MIB=4096"),
		filepath.Join(dir, "quota"), filepath.Join(dir, "usage"))
	res, v = hooked.Do("meminfo")
	if res != 0 || len(v) != 2 || v[1] != 1024<<20 {
		t.Fatalf("hooked meminfo: CUresult %d %v, want 0 and the slice's 1024 MiB cap", res, v)
	}

	select {
	case <-plain.Exited():
		t.Fatalf("cudaprog exited early: %v; stderr: %s", plain.WaitErr(), plain.Stderr())
	default:
	}
}

// TestEventually returns once the condition holds, polling meanwhile.
func TestEventually(t *testing.T) {
	n := 0
	start := time.Now()
	stubtest.Eventually(t, "third try", func() (bool, string) {
		n++
		return n == 3, fmt.Sprint(n)
	})
	if n != 3 {
		t.Errorf("tested %d times, want 3", n)
	}
	if d := time.Since(start); d < 2*stubtest.EventuallyPoll {
		t.Errorf("three tries in %v, want a poll between each", d)
	}
	if !strings.HasSuffix(stubtest.BuildDir(), "limiter/hook/build") {
		t.Errorf("BuildDir %q", stubtest.BuildDir())
	}
}
