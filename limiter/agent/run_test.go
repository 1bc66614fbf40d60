package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// recordingSink keeps what the agent writes and signals each write.
type recordingSink struct {
	mu      sync.Mutex
	reports []agentstore.NodeReport
	samples [][]agentstore.Sample
	wrote   chan struct{}
}

func newRecordingSink() *recordingSink { return &recordingSink{wrote: make(chan struct{}, 100)} }

func (r *recordingSink) AddSamples(_ context.Context, s []agentstore.Sample) error {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
	r.wrote <- struct{}{}
	return nil
}

func (r *recordingSink) Heartbeat(_ context.Context, rep agentstore.NodeReport) error {
	r.mu.Lock()
	r.reports = append(r.reports, rep)
	r.mu.Unlock()
	r.wrote <- struct{}{}
	return nil
}

// waitFor waits for writes until cond holds on the sink, or fails after 20 s.
func (r *recordingSink) waitFor(t *testing.T, what string, cond func(r *recordingSink) bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r)
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.wrote:
		case <-deadline.C:
			t.Fatalf("%s: not within 20 s", what)
		}
	}
}

// TestRunReportsXidAtOnceAndKeepsOtherGPUs runs the whole agent on the
// dgxh200 mock: an Xid 79 on GPU 3 makes the next node report (sent at
// once, without waiting for the heartbeat interval) show GPU 3 unhealthy and
// the others healthy, and the next samples of GPU 3's slices say why.
func TestRunReportsXidAtOnceAndKeepsOtherGPUs(t *testing.T) {
	e := newEnv(t)
	uuid3, _ := e.lib.Devices[3].GetUUID()
	e.pods = append(e.pods, SliceInfo{ID: "slice-d", PodUID: uidX, Pod: "nb-d", Namespace: "ns", GPU: uuid3, Initial: e.pods[0].Initial})
	xid := make(chan nvml.EventData, 1)
	registered := 0
	for i := range e.lib.Devices {
		e.dev(i).RegisterEventsFunc = func(types uint64, _ nvml.EventSet) nvml.Return {
			if types != nvml.EventTypeXidCriticalError {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			registered++
			return nvml.SUCCESS
		}
	}
	e.lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				select {
				case ev := <-xid:
					return ev, nvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	sink := newRecordingSink()
	a, err := New(Config{Node: "gpu-1", HostRoot: e.root}, Deps{NVML: e.lib, Samples: sink, Quotas: nullStore{},
		Audit: e.audit, Pods: e.pods, Proc: ProcFS{Root: e.proc.root}, Killer: e.killer, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	defer runAgent(t, a)()

	sink.waitFor(t, "first report", func(r *recordingSink) bool { return len(r.reports) == 1 })
	xid <- nvml.EventData{Device: e.lib.Devices[3], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	sink.waitFor(t, "report after the xid", func(r *recordingSink) bool { return len(r.reports) >= 2 })
	sink.mu.Lock()
	rep := sink.reports[len(sink.reports)-1]
	sink.mu.Unlock()
	var got []string
	for _, g := range rep.GPUs {
		got = append(got, fmt.Sprintf("%v %s", g.Healthy, g.Reason))
	}
	for i, g := range got {
		want := "true "
		if i == 3 {
			want = "false xid 79"
		}
		if g != want {
			t.Errorf("gpu %d: %q, want %q", i, g, want)
		}
	}
	if registered != len(e.lib.Devices) {
		t.Errorf("xid events registered on %d devices, want %d", registered, len(e.lib.Devices))
	}

	e.clock.Advance(time.Second)
	e.clock.fire(t.Context(), time.Second)
	sink.waitFor(t, "samples", func(r *recordingSink) bool { return len(r.samples) >= 1 })
	sink.mu.Lock()
	samples := sink.samples[0]
	sink.mu.Unlock()
	for _, s := range samples {
		lost := s.Slice == "slice-d"
		if lost != (s.Missing == "gpu unhealthy: xid 79") || lost != (s.MemoryUsedMiB == nil) {
			t.Errorf("sample %+v: want missing data only for slice-d, saying xid 79", s)
		}
	}
}
