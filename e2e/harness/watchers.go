package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Watchers are many event streams of one server, as many browser pages
// would hold, each recording when it received each event. Close ends them.
// Its methods are safe for concurrent use.
type Watchers struct {
	n      int
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	got  map[string]*fanout // by event id
	errs []error
}

// fanout is one event as the watchers received it.
type fanout struct {
	at   time.Time   // the event's own time (v1.Event.Time)
	recv []time.Time // when each watcher that has it read it
}

// Fanout is one event's spread: its time and, for each watcher, the time
// from the event to that watcher reading it.
type Fanout struct {
	EventID   string
	EventTime time.Time
	Latencies []time.Duration
}

// All is the time until every watcher had the event (the largest latency).
func (f Fanout) All() time.Duration { return Quantile(f.Latencies, 1) }

// OpenWatchers opens n event streams of user's server name, spread over
// clients in turn (at most 64 opening at once), and returns once every
// one is open (the broker answered 200 and started streaming). Each stream
// replays the server's past events first. On error the streams opened are
// closed again.
func OpenWatchers(ctx context.Context, clients []*Client, user, name string, n int) (*Watchers, error) {
	if n <= 0 || len(clients) == 0 {
		return nil, fmt.Errorf("watchers: %d streams over %d clients", n, len(clients))
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &Watchers{n: n, cancel: cancel, got: map[string]*fanout{}}
	sem := make(chan struct{}, 64)
	var (
		openWG  sync.WaitGroup
		openMu  sync.Mutex
		openErr []error
	)
	for i := range n {
		openWG.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			stream, err := clients[i%len(clients)].Events(sctx, user, name, "")
			<-sem
			if err != nil {
				openMu.Lock()
				openErr = append(openErr, fmt.Errorf("watcher %d: %w", i, err))
				openMu.Unlock()
				return
			}
			w.wg.Go(func() { w.read(sctx, stream) })
		})
	}
	openWG.Wait()
	if err := errors.Join(append(openErr, ctx.Err())...); err != nil {
		w.Close()
		if len(openErr) > 3 {
			err = fmt.Errorf("%d of %d watchers did not open; first: %w", len(openErr), n, errors.Join(openErr[:3]...))
		}
		return nil, err
	}
	return w, nil
}

func (w *Watchers) read(ctx context.Context, s *EventStream) {
	defer s.Close()
	for {
		ev, err := s.Next()
		now := time.Now()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, io.EOF) {
				w.mu.Lock()
				w.errs = append(w.errs, err)
				w.mu.Unlock()
			}
			return
		}
		w.mu.Lock()
		f, ok := w.got[ev.ID]
		if !ok {
			f = &fanout{at: ev.Time}
			w.got[ev.ID] = f
		}
		f.recv = append(f.recv, now)
		w.mu.Unlock()
	}
}

// WaitEvent waits up to timeout for an event whose time is at or after
// `after` to have reached every watcher, and returns its spread. It fails
// early when a stream failed.
func (w *Watchers) WaitEvent(ctx context.Context, after time.Time, timeout time.Duration) (Fanout, error) {
	var out Fanout
	err := Poll(ctx, 5*time.Millisecond, timeout, func(context.Context) (bool, string, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.errs) > 0 {
			return false, "", fmt.Errorf("%d event streams failed; first: %w", len(w.errs), w.errs[0])
		}
		most := 0
		for id, f := range w.got {
			if f.at.Before(after) {
				continue
			}
			most = max(most, len(f.recv))
			if len(f.recv) == w.n {
				out = Fanout{EventID: id, EventTime: f.at}
				for _, r := range f.recv {
					out.Latencies = append(out.Latencies, r.Sub(f.at))
				}
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("the events since reached at most %d of %d watchers", most, w.n), nil
	})
	return out, err
}

// Close ends every stream and waits for their readers.
func (w *Watchers) Close() {
	w.cancel()
	w.wg.Wait()
}
