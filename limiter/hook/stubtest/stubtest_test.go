package stubtest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// TestProgOnStub runs cudaprog on the stub driver, unhooked and hooked, and
// reads the memory total each one sees.
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
	hooked := stubtest.Start(t, append(append([]string{}, env...), "LD_PRELOAD="+stubtest.HookLibrary(),
		"GPUBROKER_SLICE_ID=s1", "GPUBROKER_GPU_UUID="+stubtest.DeviceUUID,
		"GPUBROKER_QUOTA_FILE="+dir+"/quota", "GPUBROKER_USAGE_FILE="+dir+"/usage",
		"GPUBROKER_MEMORY_LIMIT_MIB=1024", "GPUBROKER_COMPUTE_PERCENT=50", "GPUBROKER_COMPUTE_LIMIT_PERCENT=50"))
	res, v = hooked.Do("meminfo")
	if res != 0 || len(v) != 2 || v[1] != 1024<<20 {
		t.Fatalf("hooked meminfo: CUresult %d %v, want 0 and the 1024 MiB cap", res, v)
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
