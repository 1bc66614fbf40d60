package agentstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// Sample is one NVML reading for one slice (ARCHITECTURE.md "Sample"). Optional
// fields are nil when the agent could not measure them; nil means missing,
// never zero, and Missing says why.
type Sample struct {
	// ID is the stream entry id; set by reads, ignored by writes.
	ID string
	// Slice is the slice id (the server's spawn id).
	Slice string
	// At is when the agent took the sample (agent's clock, ms precision).
	At time.Time
	// Interval is the agent's sampling interval; staleness is measured in it.
	Interval time.Duration
	// SMPercent is the slice's SM utilization over the last interval, percent
	// of the whole device, 0..100 (the sum over its processes).
	SMPercent *int
	// MemoryUsedMiB is the device memory held by the slice's processes as
	// NVML reports it, MiB rounded up (1 MiB = 2^20 bytes).
	MemoryUsedMiB *int64
	// MemoryLimitMiB is the slice's memory cap in effect, MiB; 0 = unknown.
	MemoryLimitMiB int64
	// Processes is the number of the slice's processes on the GPU.
	Processes *int
	// LastKernel is the time of the slice's last kernel launch as the hooks
	// recorded it in the usage region (advisory). Non-nil zero time means
	// "no launch recorded yet".
	LastKernel *time.Time
	// Missing names why fields are missing ("" when none are), e.g.
	// "gpu lost" or "process utilization: Not Supported".
	Missing string
	// Guarantee is promised vs delivered over the agent's window, for
	// sliced and MPS slices; nil for the others (MIG, whole GPUs).
	Guarantee *v1.Guarantee
}

// Stale reports whether the sample is older than StaleAfter intervals at
// now (the reader's clock): now is after FreshUntil. A sample without an
// interval is stale.
func (s Sample) Stale(now time.Time) bool { return now.After(s.FreshUntil()) }

// FreshUntil is the last instant at which the sample is fresh: At plus
// StaleAfter intervals; the zero time (always stale) without an interval.
func (s Sample) FreshUntil() time.Time {
	if s.Interval <= 0 {
		return time.Time{}
	}
	return s.At.Add(StaleAfter * s.Interval)
}

// Stream entry fields. Every entry carries every field, "" when missing, so
// that Redis stores the field names once per listpack node (entries with
// the master entry's fields are compressed).
const (
	fAt       = "t"   // Unix ms
	fInterval = "iv"  // ms
	fSM       = "sm"  // percent
	fMem      = "mem" // MiB
	fLimit    = "lim" // MiB
	fProcs    = "np"
	fKernel   = "lk" // Unix ms; 0 = none recorded
	fMissing  = "miss"
	// fGuarantee is "<percent>/<window s>/<wanted s>/<met s>"; "" = none.
	fGuarantee = "g"
)

func sampleValues(s Sample) []any {
	opt := func(p *int64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatInt(*p, 10)
	}
	optInt := func(p *int) string {
		if p == nil {
			return ""
		}
		return strconv.Itoa(*p)
	}
	kernel := ""
	if s.LastKernel != nil {
		if s.LastKernel.IsZero() {
			kernel = "0"
		} else {
			kernel = strconv.FormatInt(s.LastKernel.UnixMilli(), 10)
		}
	}
	return []any{
		fAt, strconv.FormatInt(s.At.UnixMilli(), 10),
		fInterval, strconv.FormatInt(s.Interval.Milliseconds(), 10),
		fSM, optInt(s.SMPercent),
		fMem, opt(s.MemoryUsedMiB),
		fLimit, strconv.FormatInt(s.MemoryLimitMiB, 10),
		fProcs, optInt(s.Processes),
		fKernel, kernel,
		fMissing, s.Missing,
		fGuarantee, guaranteeValue(s.Guarantee),
	}
}

func guaranteeValue(g *v1.Guarantee) string {
	if g == nil {
		return ""
	}
	return fmt.Sprintf("%d/%d/%d/%d", g.Percent, g.WindowSeconds, g.WantedSeconds, g.MetSeconds)
}

func parseGuarantee(v string) (*v1.Guarantee, error) {
	if v == "" {
		return nil, nil
	}
	var g v1.Guarantee
	if n, err := fmt.Sscanf(v, "%d/%d/%d/%d", &g.Percent, &g.WindowSeconds, &g.WantedSeconds, &g.MetSeconds); err != nil || n != 4 {
		return nil, fmt.Errorf("field %s %q: want percent/window/wanted/met", fGuarantee, v)
	}
	return &g, nil
}

// XAddArgs returns the XADD arguments AddSamples uses for s, for callers
// that compare against a raw pipeline (the benchmark).
func (st *Store) XAddArgs(s Sample) *redis.XAddArgs {
	return &redis.XAddArgs{
		Stream: st.k.Samples(s.Slice),
		MaxLen: st.maxLen,
		Approx: true,
		ID:     "*",
		Values: sampleValues(s),
	}
}

// AddSamples appends each sample to its slice's stream in one pipeline,
// trimming each stream to about MaxLen entries, and refreshes a stream's
// TTL at most once per SampleTTL/10 (judged by the samples' At). An empty
// slice id is refused.
func (st *Store) AddSamples(ctx context.Context, samples []Sample) error {
	if len(samples) == 0 {
		return nil
	}
	for _, s := range samples {
		if s.Slice == "" {
			return errors.New("add samples: empty slice id")
		}
	}
	ctx, cancel := st.op(ctx)
	defer cancel()
	_, err := st.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, s := range samples {
			p.XAdd(ctx, st.XAddArgs(s))
			if st.needsExpire(s.Slice, s.At) {
				p.PExpire(ctx, st.k.Samples(s.Slice), st.sampleTTL)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add %d samples: %w", len(samples), err)
	}
	return nil
}

// LatestSample returns the newest sample of slice, or an error wrapping
// ErrNotFound when there is none.
func (st *Store) LatestSample(ctx context.Context, slice string) (Sample, error) {
	ss, err := st.RecentSamples(ctx, slice, 1)
	if err != nil {
		return Sample{}, err
	}
	if len(ss) == 0 {
		return Sample{}, fmt.Errorf("%w: no samples of slice %s", ErrNotFound, slice)
	}
	return ss[0], nil
}

// RecentSamples returns up to n of slice's newest samples, newest first.
func (st *Store) RecentSamples(ctx context.Context, slice string, n int64) ([]Sample, error) {
	ctx, cancel := st.op(ctx)
	defer cancel()
	msgs, err := st.rdb.XRevRangeN(ctx, st.k.Samples(slice), "+", "-", n).Result()
	if err != nil {
		return nil, fmt.Errorf("samples of slice %s: %w", slice, err)
	}
	out := make([]Sample, 0, len(msgs))
	for _, m := range msgs {
		s, err := decodeSample(slice, m)
		if err != nil {
			return nil, fmt.Errorf("sample %s of slice %s: %w", m.ID, slice, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// sampleBatch is how many slices one pipeline of RecentSamplesBatch reads.
const sampleBatch = 1000

// RecentSamplesBatch reads the newest samples of many slices, pipelined in
// batches of sampleBatch slices: for each slice (in order), up to n
// samples, newest first, ending with the first one taken before since (so
// the newest sample is always there, however old) or, when a sample does
// not decode, just before it: a corrupt sample ends the slice's usable
// history, and older ones are not trusted either. A slice without samples
// has none. The idle reclaimer reads every running slice's window this
// way once per cycle.
func (st *Store) RecentSamplesBatch(ctx context.Context, slices []string, n int64, since time.Time) ([][]Sample, error) {
	out := make([][]Sample, len(slices))
	for lo := 0; lo < len(slices); lo += sampleBatch {
		hi := min(lo+sampleBatch, len(slices))
		cmds := make([]*redis.XMessageSliceCmd, hi-lo)
		octx, cancel := st.op(ctx)
		_, err := st.rdb.Pipelined(octx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				cmds[i-lo] = p.XRevRangeN(octx, st.k.Samples(slices[i]), "+", "-", n)
			}
			return nil
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("samples of %d slices: %w", hi-lo, err)
		}
		for i := lo; i < hi; i++ {
			for _, m := range cmds[i-lo].Val() {
				s, err := decodeSample(slices[i], m)
				if err != nil {
					break
				}
				out[i] = append(out[i], s)
				if s.At.Before(since) {
					break
				}
			}
		}
	}
	return out, nil
}

func decodeSample(slice string, m redis.XMessage) (Sample, error) {
	var errs []error
	str := func(f string) string {
		v, ok := m.Values[f].(string)
		if !ok {
			errs = append(errs, fmt.Errorf("field %s missing or not a string", f))
		}
		return v
	}
	num := func(f string) (int64, bool) {
		v := str(f)
		if v == "" {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("field %s: %w", f, err))
			return 0, false
		}
		return n, true
	}
	s := Sample{ID: m.ID, Slice: slice, Missing: str(fMissing)}
	if at, ok := num(fAt); ok {
		s.At = time.UnixMilli(at).UTC()
	}
	if iv, ok := num(fInterval); ok {
		s.Interval = time.Duration(iv) * time.Millisecond
	}
	if v, ok := num(fSM); ok {
		n := int(v)
		s.SMPercent = &n
	}
	if v, ok := num(fMem); ok {
		s.MemoryUsedMiB = &v
	}
	s.MemoryLimitMiB, _ = num(fLimit)
	if v, ok := num(fProcs); ok {
		n := int(v)
		s.Processes = &n
	}
	if v, ok := num(fKernel); ok {
		var t time.Time
		if v != 0 {
			t = time.UnixMilli(v).UTC()
		}
		s.LastKernel = &t
	}
	// Entries written before the field existed lack it: no guarantee.
	if v, ok := m.Values[fGuarantee].(string); ok {
		g, err := parseGuarantee(v)
		errs = append(errs, err)
		s.Guarantee = g
	}
	if err := errors.Join(errs...); err != nil {
		return Sample{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return s, nil
}
