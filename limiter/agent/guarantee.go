package agent

import (
	"math"
	"sync"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// Promised vs delivered: for every sliced and MPS slice the agent measures
// how often the tenant got its guaranteed compute when it wanted it.
//
// Each sampling round is one window (Config.SampleInterval). The slice
// wanted its guarantee in a window when it had work waiting:
//   - the hook throttled it: the usage region's pace wait counter (the time
//     the slice's launches waited for tokens) grew since the last round; or
//   - it launched continuously: its launch count grew in at least
//     busyFraction of the pace feed's ticks (every PaceInterval) of the
//     window, and there were at least minTicks of them.
//
// A window in which it wanted is met when the SM share NVML measured for
// the slice is at least metFraction of its guaranteed percent (the
// current quota's), or when the SMs it fell short by were left idle: the
// GPU's measured use plus the shortfall fit in 100 %, so no other tenant
// took them and the shortfall was the program's own pace (a CPU-starved
// launcher, a controller catching up), not a broken promise. Windows
// whose SM share is unknown count for neither.
// The last GuaranteeWindow of windows are kept per slice in a ring; the
// figures are the counts in it times the interval. The launch counts come
// from the usage region, which the tenant can write: a tenant can make
// itself look idle (never wanting) or busy (wanting what it does not
// use), so the figure is about its own guarantee only and widens nothing.
//
// Known limits: a tenant launching tiny kernels at least every tick on a
// full GPU counts as wanting and, getting little SM time, as not met; MPS
// clients are measured only where NVML attributes SM time to them.
const (
	// GuaranteeWindow is the span of the figures.
	GuaranteeWindow = time.Hour
	metFraction     = 0.9
	busyFraction    = 0.8
	minTicks        = 3
)

// guaranteeBook is one slice's ring of windows.
type guaranteeBook struct {
	ring        []uint8 // 0: not wanted or unknown, 1: wanted and missed, 2: wanted and met
	pos         int
	wanted, met int
	prevWait    time.Duration
	waitKnown   bool
	percent     int
	gpu         string
}

// launchTicks counts one slice's pace ticks with and without launches
// since the last sampling round.
type launchTicks struct {
	ticks, busy int
	last        uint64
	seen        bool
}

// guarantees holds every slice's book. Safe for concurrent use: the pace
// goroutine ticks, the sampling goroutine rounds, the heartbeat reads.
type guarantees struct {
	mu       sync.Mutex
	interval time.Duration
	size     int
	books    map[string]*guaranteeBook
	ticks    map[string]*launchTicks
}

func newGuarantees(interval time.Duration) *guarantees {
	if interval <= 0 {
		interval = DefaultSampleInterval
	}
	return &guarantees{interval: interval, size: max(int(GuaranteeWindow/interval), 1),
		books: map[string]*guaranteeBook{}, ticks: map[string]*launchTicks{}}
}

// tick records one pace tick of slice: launches is its launch count now.
func (g *guarantees) tick(slice string, launches uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.ticks[slice]
	if t == nil {
		t = &launchTicks{}
		g.ticks[slice] = t
	}
	if t.seen {
		t.ticks++
		if launches > t.last {
			t.busy++
		}
	}
	t.last, t.seen = launches, true
}

// window is one sampling round's reading of a slice.
type window struct {
	slice, gpu string
	percent    int  // guaranteed compute, percent
	sm         *int // measured SM share, percent; nil = unknown
	device     *int // the GPU's measured SM use, percent; nil = unknown
	wait       time.Duration
	waitKnown  bool // the usage region was read
}

// round closes one window of w.slice and returns the slice's figures and
// what the window was.
func (g *guarantees) round(w window) (out v1.Guarantee, wanted, met bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.books[w.slice]
	if b == nil {
		b = &guaranteeBook{ring: make([]uint8, g.size)}
		g.books[w.slice] = b
	}
	b.percent, b.gpu = w.percent, w.gpu
	throttled := w.waitKnown && b.waitKnown && w.wait > b.prevWait
	if w.waitKnown {
		b.prevWait, b.waitKnown = w.wait, true
	}
	continuous := false
	if t := g.ticks[w.slice]; t != nil {
		continuous = t.ticks >= minTicks && float64(t.busy) >= busyFraction*float64(t.ticks)
		t.ticks, t.busy = 0, 0
	}
	wanted = (throttled || continuous) && w.sm != nil && w.percent > 0
	if wanted {
		short := metFraction*float64(w.percent) - float64(*w.sm)
		met = short <= 0 || (w.device != nil && float64(*w.device)+short <= 100)
	}
	v := uint8(0)
	switch {
	case met:
		v = 2
	case wanted:
		v = 1
	}
	switch b.ring[b.pos] {
	case 2:
		b.met--
		b.wanted--
	case 1:
		b.wanted--
	}
	b.ring[b.pos] = v
	b.pos = (b.pos + 1) % len(b.ring)
	if v > 0 {
		b.wanted++
	}
	if v == 2 {
		b.met++
	}
	return g.figures(w.slice, b), wanted, met
}

// figures is b's Guarantee (mu held).
func (g *guarantees) figures(slice string, b *guaranteeBook) v1.Guarantee {
	sec := func(n int) int64 { return int64(math.Round(float64(n) * g.interval.Seconds())) }
	return v1.Guarantee{Percent: b.percent, WindowSeconds: sec(len(b.ring)), WantedSeconds: sec(b.wanted), MetSeconds: sec(b.met)}
}

// forget drops slice's book.
func (g *guarantees) forget(slice string) {
	g.mu.Lock()
	delete(g.books, slice)
	delete(g.ticks, slice)
	g.mu.Unlock()
}

// summaries returns, per GPU, the figures of its tenant that fared worst
// among those that asked in the window, with Slice and Tenants set.
func (g *guarantees) summaries() map[string]v1.Guarantee {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]v1.Guarantee{}
	for id, b := range g.books {
		if b.wanted == 0 {
			continue
		}
		f := g.figures(id, b)
		f.Slice = id
		cur, ok := out[b.gpu]
		f.Tenants = cur.Tenants + 1
		if !ok || f.Ratio() < cur.Ratio() || (f.Ratio() == cur.Ratio() && id < cur.Slice) {
			out[b.gpu] = f
		} else {
			cur.Tenants = f.Tenants
			out[b.gpu] = cur
		}
	}
	return out
}

// guaranteeSummaries is the agent's per-GPU summary for the node report.
func (a *Agent) guaranteeSummaries() map[string]v1.Guarantee {
	return a.guarantees.summaries()
}

// guaranteed returns the compute percent slice s is guaranteed now: its
// quota file's, else its pod's.
func (a *Agent) guaranteed(s SliceInfo) int {
	a.quotaMu.Lock()
	defer a.quotaMu.Unlock()
	if p, ok := a.computes[s.ID]; ok {
		return p
	}
	return s.Initial.ComputePercent
}

// measureGuarantee closes the window of one slice's sampling round: its
// figures go into the sample and the metrics. Only sliced and MPS slices
// have a guarantee to measure.
func (a *Agent) measureGuarantee(sr *sliceRound, u usageView) {
	if sr.Info.Sharing != v1.SharingSliced && sr.Info.Sharing != v1.SharingMPS && sr.Info.Sharing != "" {
		return
	}
	w := window{slice: sr.Info.ID, gpu: sr.Info.GPU, percent: a.guaranteed(sr.Info), sm: sr.Sample.SMPercent,
		device: sr.DeviceSMPercent, wait: u.paceWait, waitKnown: u.read}
	f, wanted, met := a.guarantees.round(w)
	sr.Sample.Guarantee = &f
	labels := []string{sr.Info.ID, sr.Info.GPU}
	a.metrics.guaranteePercent.WithLabelValues(labels...).Set(float64(f.Percent))
	// Both counters exist from a slice's first round, at zero while it has
	// asked for nothing, so increase() over them has series to work on.
	wantedC, metC := a.metrics.guaranteeWanted.WithLabelValues(labels...), a.metrics.guaranteeMet.WithLabelValues(labels...)
	wantedC.Add(0)
	metC.Add(0)
	if wanted {
		wantedC.Add(a.cfg.SampleInterval.Seconds())
	}
	if met {
		metC.Add(a.cfg.SampleInterval.Seconds())
	}
	if f.WantedSeconds > 0 {
		a.metrics.guaranteeRatio.WithLabelValues(labels...).Set(f.Ratio())
	} else {
		a.metrics.guaranteeRatio.DeleteLabelValues(labels...)
	}
}
