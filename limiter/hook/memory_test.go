package hook_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/limiter/region"
)

// TestMemoryCapHoldsForEveryAllocationFamily fills a 64 MiB slice with each
// allocation family, called directly and through cuGetProcAddress, and
// checks that the refusal is CUDA_ERROR_OUT_OF_MEMORY, that the driver really
// holds no more than the slice, that the slice was actually filled, and that
// freeing gives everything back.
func TestMemoryCapHoldsForEveryAllocationFamily(t *testing.T) {
	t.Parallel()
	const limit = 64 * mib
	kinds := []string{"linear", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"}
	for _, path := range []string{"direct", "cuGetProcAddress", "cuGetProcAddress per-thread"} {
		for _, kind := range kinds {
			t.Run(path+"/"+kind, func(t *testing.T) {
				t.Parallel()
				dev := newDevice(t)
				f := dev.newSlice("s")
				args := []string{}
				switch path {
				case "cuGetProcAddress":
					args = append(args, "-p")
				case "cuGetProcAddress per-thread":
					args = append(args, "-P") // the _ptsz entry points
				}
				p := dev.start(f, slice{MemoryMiB: limit / mib, ComputePercent: 100}, args...)
				fill := p.do(fmt.Sprintf("fill %s %d", kind, 4*mib))
				if fill.Res != cudaOutOfMemory {
					t.Fatalf("fill ended with CUresult %d, want %d (CUDA_ERROR_OUT_OF_MEMORY)", fill.Res, cudaOutOfMemory)
				}
				held := dev.stub().procMem(p.pid())
				if held > limit {
					t.Errorf("driver holds %d bytes for the process, more than the %d-byte slice", held, limit)
				}
				if held < limit-6*mib {
					t.Errorf("driver holds %d bytes: the slice (%d) was refused long before it was full", held, limit)
				}
				usage, err := region.ReadUsage(f.Usage)
				if err != nil {
					t.Fatal(err)
				}
				st := dev.stub()
				if got := usage.BytesInUse(st.UUID); got != held {
					t.Errorf("usage region charges %d bytes, driver holds %d", got, held)
				}
				mi := p.do("meminfo")
				if mi.Res != cudaSuccess || mi.Vals[1] != limit || mi.Vals[0] != limit-held {
					t.Errorf("cuMemGetInfo = %v (CUresult %d), want free %d total %d", mi.Vals, mi.Res, limit-held, limit)
				}
				if r := p.do("freeall"); r.Res != cudaSuccess {
					t.Fatalf("freeall: CUresult %d", r.Res)
				}
				if held := dev.stub().procMem(p.pid()); held != 0 {
					t.Errorf("after freeing everything the driver still holds %d bytes", held)
				}
				usage, err = region.ReadUsage(f.Usage)
				if err != nil {
					t.Fatal(err)
				}
				if got := usage.BytesInUse(st.UUID); got != 0 {
					t.Errorf("after freeing everything the usage region still charges %d bytes", got)
				}
			})
		}
	}
}

// TestGraphMemoryNodesAreCapped: a graph memory node that fits is accepted
// and charged once the graph runs; one that does not fit is refused.
func TestGraphMemoryNodesAreCapped(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 100})
	if r := p.do(fmt.Sprintf("alloc graph %d", 40*mib)); r.Res != cudaSuccess {
		t.Fatalf("40 MiB graph node in a 64 MiB slice: CUresult %d", r.Res)
	}
	if mi := p.do("meminfo"); mi.Vals[0] != 24*mib {
		t.Errorf("free after graph launch = %d, want %d (graph reservation charged)", mi.Vals[0], 24*mib)
	}
	if r := p.do(fmt.Sprintf("alloc graph %d", 40*mib)); r.Res != cudaOutOfMemory {
		t.Errorf("second 40 MiB graph node: CUresult %d, want %d", r.Res, cudaOutOfMemory)
	}
}

// TestMemoryCapHoldsForTheSumOfProcesses runs three processes of one slice
// filling it at the same time: together they never exceed it, and together
// they fill it.
func TestMemoryCapHoldsForTheSumOfProcesses(t *testing.T) {
	t.Parallel()
	const limit = 96 * mib
	dev := newDevice(t)
	f := dev.newSlice("s")
	var procs []*proc
	for range 3 {
		procs = append(procs, dev.start(f, slice{MemoryMiB: limit / mib, ComputePercent: 100}))
	}
	// Send the three commands back to back so the processes fill at the same time.
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() {
			if _, err := fmt.Fprintf(p.stdin, "fill linear %d\n", mib); err != nil {
				t.Errorf("send: %v", err)
			}
		})
	}
	wg.Wait()
	for i, p := range procs {
		if r := p.next(30 * time.Second); r.Res != cudaOutOfMemory {
			t.Errorf("process %d: fill ended with %d, want OOM", i, r.Res)
		}
	}
	st := dev.stub()
	var sum uint64
	for _, p := range procs {
		sum += st.procMem(p.pid())
	}
	if sum > limit {
		t.Errorf("three processes hold %d bytes together, more than the %d-byte slice", sum, limit)
	}
	if sum < limit-3*mib {
		t.Errorf("three processes hold %d bytes together: the %d-byte slice was refused before it was full", sum, limit)
	}
	// Freed by one, usable by another.
	if r := procs[0].do("freeall"); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	got := procs[1].do(fmt.Sprintf("fill linear %d", mib))
	if want := st.procMem(procs[0].pid()) / mib; got.Vals[0] != want {
		t.Errorf("after process 0 freed %d MiB, process 1 got %d MiB", want, got.Vals[0])
	}
}

// TestAsyncAllocFreeCyclesReturnToBaseline runs 1,000 stream-ordered
// alloc/free cycles: the slice's use goes back to where it started.
func TestAsyncAllocFreeCyclesReturnToBaseline(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 100})
	if r := p.do(fmt.Sprintf("alloc linear %d", 8*mib)); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	before := p.do("meminfo")
	if r := p.do(fmt.Sprintf("asyncloop 1000 %d", 3*mib)); r.Res != cudaSuccess {
		t.Fatalf("asyncloop: CUresult %d", r.Res)
	}
	after := p.do("meminfo")
	if before.Vals[0] != after.Vals[0] {
		t.Errorf("free memory before %d, after 1000 async cycles %d", before.Vals[0], after.Vals[0])
	}
	st := dev.stub()
	if st.Counters.Alloc < 1001 {
		t.Errorf("driver saw %d allocations, want >= 1001: the cycles did not reach it", st.Counters.Alloc)
	}
	if held := st.procMem(p.pid()); held != 8*mib {
		t.Errorf("driver holds %d bytes, want %d (pools trimmed back)", held, 8*mib)
	}
	usage, err := region.ReadUsage(f.Usage)
	if err != nil {
		t.Fatal(err)
	}
	if got := usage.BytesInUse(st.UUID); got != 8*mib {
		t.Errorf("usage region charges %d bytes, want %d", got, 8*mib)
	}
}

// TestUnknownPointerFreeReachesDriver: a free of an address the hook never
// handed out is forwarded, and the driver's own result comes back.
func TestUnknownPointerFreeReachesDriver(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	r, _ := dev.run(f, slice{MemoryMiB: 64, ComputePercent: 100}, false, "freeunknown")
	if r[0].Res != cudaInvalidValue {
		t.Errorf("free of an unknown pointer: CUresult %d, want the driver's %d", r[0].Res, cudaInvalidValue)
	}
	if n := dev.stub().Counters.FreeUnknown; n != 1 {
		t.Errorf("driver counted %d unknown frees, want 1", n)
	}
}

// TestMemoryQueriesShowTheSlice: cuMemGetInfo, cuDeviceTotalMem and NVML
// memory info (v1 and v2) report the slice, not the card.
func TestMemoryQueriesShowTheSlice(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	r, _ := dev.run(f, slice{MemoryMiB: 100, ComputePercent: 100}, false,
		fmt.Sprintf("alloc linear %d", 30*mib), "meminfo", "totalmem", "nvmlmem")
	want := []reply{
		{Cmd: "alloc", Res: 0},
		{Cmd: "meminfo", Res: 0, Vals: []uint64{70 * mib, 100 * mib}},                                          // free, total
		{Cmd: "totalmem", Res: 0, Vals: []uint64{100 * mib}},                                                   // bytes
		{Cmd: "nvmlmem", Res: 0, Vals: []uint64{100 * mib, 30 * mib, 70 * mib, 100 * mib, 30 * mib, 70 * mib}}, // v1, v2: total used free
	}
	if diff := cmp.Diff(want, r); diff != "" {
		t.Errorf("memory queries (-want +got):\n%s", diff)
	}
}

// TestFullComputeStillCapsMemory: memory and compute are independent.
func TestFullComputeStillCapsMemory(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	r, _ := dev.run(f, slice{MemoryMiB: 16, ComputePercent: 100, ComputeLimitPercent: 100}, false,
		fmt.Sprintf("fill linear %d", mib), "launch kernel busy_10us 132 10")
	if r[0].Res != cudaOutOfMemory || r[0].Vals[1] != 16*mib {
		t.Errorf("fill = %+v, want OOM after exactly 16 MiB", r[0])
	}
	if r[1].Res != cudaSuccess {
		t.Errorf("launch with full compute: CUresult %d", r[1].Res)
	}
}

// TestFailClosedWithoutQuota: no env and no file means no device memory,
// with a clear message, never unlimited.
func TestFailClosedWithoutQuota(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	r, stderr := dev.run(f, slice{}, false, fmt.Sprintf("alloc linear %d", mib), "meminfo")
	if r[0].Res != cudaOutOfMemory {
		t.Errorf("alloc without any quota: CUresult %d, want OOM", r[0].Res)
	}
	if r[1].Vals[1] != 0 {
		t.Errorf("cuMemGetInfo total without quota = %d, want 0", r[1].Vals[1])
	}
	if !strings.Contains(stderr, "failing closed") {
		t.Errorf("stderr does not explain the refusal:\n%s", stderr)
	}
}

// TestMemoryCapHoldsForThreads: eight threads of one process fill the slice
// at once; together they stay within it and fill it, and after they free
// everything nothing stays charged.
func TestMemoryCapHoldsForThreads(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 128, ComputePercent: 100})
	r := p.do(fmt.Sprintf("threads 8 %d", mib))
	if r.Res != cudaSuccess || r.Vals[0] > 128 || r.Vals[0] < 128-8 {
		t.Errorf("8 threads held %d MiB together at their peak, want 120..128", r.Vals[0])
	}
	if r.Vals[1] != (128-r.Vals[0])*mib {
		t.Errorf("cuMemGetInfo free at the peak = %d, want %d", r.Vals[1], (128-r.Vals[0])*mib)
	}
	st := dev.stub()
	usage, err := region.ReadUsage(f.Usage)
	if err != nil {
		t.Fatal(err)
	}
	if got := usage.BytesInUse(st.UUID); got != 0 || st.procMem(p.pid()) != 0 {
		t.Errorf("after the threads freed everything: usage %d bytes, driver %d bytes; want 0", got, st.procMem(p.pid()))
	}
}

// TestForkedChildIsAccountedOnItsOwn: a child forked by a process with
// allocations starts with none of its parent's books, gets its own slot and
// leaves nothing behind when it exits.
func TestForkedChildIsAccountedOnItsOwn(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 100})
	if r := p.do(fmt.Sprintf("alloc linear %d", 40*mib)); r.Res != cudaSuccess {
		t.Fatal(r)
	}
	if r := p.do(fmt.Sprintf("fork %d", 30*mib)); r.Vals[0] != cudaOutOfMemory {
		t.Errorf("child's 30 MiB next to the parent's 40 in a 64 MiB slice: CUresult %d, want OOM", r.Vals[0])
	}
	if r := p.do(fmt.Sprintf("fork %d", 20*mib)); r.Vals[0] != cudaSuccess {
		t.Errorf("child's 20 MiB next to the parent's 40: CUresult %d, want success", r.Vals[0])
	}
	if mi := p.do("meminfo"); mi.Vals[0] != 24*mib {
		t.Errorf("parent's cuMemGetInfo free after the children exited = %d, want %d", mi.Vals[0], 24*mib)
	}
	// The children left with _exit (no destructor): their slots may still be
	// there, but only live processes count, which is what readers must check.
	usage, err := region.ReadUsage(f.Usage)
	if err != nil {
		t.Fatal(err)
	}
	var live []region.ProcessUsage
	for _, pu := range usage.Processes {
		if err := syscall.Kill(int(pu.PID), 0); !errors.Is(err, syscall.ESRCH) {
			live = append(live, pu)
		}
	}
	if len(live) != 1 || live[0].PID != uint32(p.pid()) || len(live[0].Devices) != 1 || live[0].Devices[0].BytesInUse != 40*mib {
		t.Errorf("live processes in the usage region = %+v, want the parent with 40 MiB", live)
	}
}

// TestContextEndReleasesCharges: when a context ends (cuCtxDestroy,
// cuDevicePrimaryCtxReset) the driver frees its memory, and the slice stops
// counting it.
func TestContextEndReleasesCharges(t *testing.T) {
	t.Parallel()
	dev := newDevice(t)
	f := dev.newSlice("s")
	p := dev.start(f, slice{MemoryMiB: 64, ComputePercent: 100})
	for _, c := range []string{fmt.Sprintf("alloc linear %d", 40*mib), fmt.Sprintf("alloc async %d", 8*mib)} {
		if r := p.do(c); r.Res != cudaSuccess {
			t.Fatalf("%s: CUresult %d", c, r.Res)
		}
	}
	if mi := p.do("meminfo"); mi.Vals[0] != 16*mib {
		t.Fatalf("free before the reset = %d, want %d", mi.Vals[0], 16*mib)
	}
	if r := p.do("reset"); r.Res != cudaSuccess {
		t.Fatalf("cuDevicePrimaryCtxReset: CUresult %d", r.Res)
	}
	if mi := p.do("meminfo"); mi.Vals[0] != 64*mib {
		t.Errorf("free after cuDevicePrimaryCtxReset = %d, want the whole %d", mi.Vals[0], 64*mib)
	}
	if r := p.do(fmt.Sprintf("ctxcycle %d", 48*mib)); r.Res != cudaSuccess || r.Vals[0] != cudaSuccess {
		t.Fatalf("ctxcycle: %+v", r)
	}
	if mi := p.do("meminfo"); mi.Vals[0] != 64*mib {
		t.Errorf("free after cuCtxDestroy = %d, want the whole %d", mi.Vals[0], 64*mib)
	}
	st := dev.stub()
	usage, err := region.ReadUsage(f.Usage)
	if err != nil {
		t.Fatal(err)
	}
	if got := usage.BytesInUse(st.UUID); got != 0 || st.procMem(p.pid()) != 0 {
		t.Errorf("after the contexts ended: usage %d bytes, driver %d bytes; want 0", got, st.procMem(p.pid()))
	}
	if r := p.do(fmt.Sprintf("fill linear %d", mib)); r.Vals[0] != 64 {
		t.Errorf("after the contexts ended the slice gave %d MiB, want 64", r.Vals[0])
	}
}
