package app

import (
	"context"
	"hash/fnv"
	"log/slog"
	"sync"

	"github.com/gpubroker/gpubroker/spawner"
)

// podEventWorkers is how many pod events are applied at once. Events of
// one pod always go to the same worker, so they stay in order; events of
// different pods (different spawns) are applied side by side, each a few
// Redis round trips, instead of queueing behind one another.
const podEventWorkers = 16

// podEventQueue is how many pod events wait for each worker before the
// queue counts as overflowed.
const podEventQueue = 256

// podSource is where pod observations come from (*spawner.Client).
type podSource interface {
	Subscribe(ctx context.Context, fn func(spawner.PodEvent))
}

// podEvents applies the pod observations of a podSource while this replica
// leads (leading); see forwardPodEvents.
type podEvents struct {
	source   podSource
	apply    func(context.Context, spawner.PodEvent) error // servers.Service.HandlePodEvent
	leading  func() bool
	overflow func() // asks for a reconcile pass
	log      *slog.Logger
}

// forwardPodEvents hands the pod observations to the lifecycle on the
// replica that leads (the Lease holder, or the only replica when no Lease
// is configured); the others drop them. Every replica keeps its pod cache
// (stops ask it whether a pod is there), but applying each event on every
// replica read the record once per replica for each event and changed
// nothing the first had not. A replica that starts leading
// makes a reconcile pass at once (reconcile.Reconciler.SetLeading), which
// applies every pod's current phase, so the events of the time no replica
// led (its holder died; at most the Lease duration) are not lost: a pod
// that ended is held by its finalizer until its end is recorded.
//
// The spawner's dispatcher must not block, so events pass through a
// buffer per worker; if one overflows, the reconciler is asked for a pass,
// which replays every pod's current phase. A storage failure is logged and
// left to that pass too.
func forwardPodEvents(ctx context.Context, p *parts) error {
	return podEvents{
		source: p.spawner, apply: p.service.HandlePodEvent, leading: p.leading.Load,
		overflow: p.reconciler.Trigger, log: p.log,
	}.run(ctx)
}

// run applies the source's events until ctx ends; it always returns nil.
func (f podEvents) run(ctx context.Context) error {
	queues := make([]chan spawner.PodEvent, podEventWorkers)
	for i := range queues {
		queues[i] = make(chan spawner.PodEvent, podEventQueue)
	}
	f.source.Subscribe(ctx, func(ev spawner.PodEvent) {
		if !f.leading() {
			return // the leader applies it
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(ev.Pod)) // hash.Hash.Write never fails
		select {
		case queues[h.Sum32()%podEventWorkers] <- ev:
		default:
			f.overflow()
		}
	})
	var wg sync.WaitGroup
	for _, q := range queues {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-q:
					if err := f.apply(ctx, ev); err != nil && ctx.Err() == nil {
						f.log.WarnContext(ctx, "pod event not applied; the reconciler will retry", "pod", ev.Pod, "err", err)
					}
				}
			}
		})
	}
	wg.Wait()
	return nil
}
