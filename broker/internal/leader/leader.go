package leader

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config says which Lease elects the replica that runs the work.
type Config struct {
	// Client reaches the API server; required.
	Client kubernetes.Interface
	// Namespace and Name of the Lease; required.
	Namespace, Name string
	// Identity of this replica (the pod name); required.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as in client-go's
	// leaderelection; zero means 15 s, 10 s and 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnLeader, when set, is told when this replica starts (true) and stops
	// (false) leading; for logs and metrics.
	OnLeader func(leading bool)
}

// Run runs run while this replica holds the Lease, campaigning again
// whenever it loses it, until ctx ends. The Lease is released when ctx ends
// (ReleaseOnCancel), so another replica takes over within RetryPeriod
// instead of LeaseDuration. run's context ends when leadership is lost;
// Run waits for run to return before campaigning again or
// returning. Errors: an invalid config; run's own errors are returned only
// when they are not caused by the end of its context.
func Run(ctx context.Context, cfg Config, run func(ctx context.Context) error) error {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Name == "" || cfg.Identity == "" {
		return errors.New("leader election needs a client, the lease namespace and name, and an identity")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	lease := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	notify := func(b bool) {
		if cfg.OnLeader != nil {
			cfg.OnLeader(b)
		}
	}
	for ctx.Err() == nil {
		lock := &acquireLock{Interface: lease}
		finished := make(chan struct{})
		var runErr error
		// The elector gets its own context, stopped only after run has
		// returned: the Lease is released (ReleaseOnCancel) when this
		// replica no longer acts, so two replicas never run at once.
		ectx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: cfg.Name, ReleaseOnCancel: true,
			LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				// client-go starts this goroutine once the lease is
				// acquired; Run waits for finished.
				OnStartedLeading: func(lctx context.Context) {
					defer close(finished)
					rctx, cancel := context.WithCancel(lctx)
					defer cancel()
					stop := context.AfterFunc(ctx, cancel)
					defer stop()
					notify(true)
					defer notify(false)
					if err := run(rctx); err != nil && rctx.Err() == nil {
						runErr = err
					}
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			stopElector()
			return fmt.Errorf("leader election: %w", err)
		}
		electorDone := make(chan struct{})
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			select {
			case <-ctx.Done():
				if lock.acquired.Load() {
					<-finished // run's context ends with ctx
				}
				stopElector()
			case <-electorDone:
			}
		}()
		le.Run(ectx)
		close(electorDone)
		stopElector()
		<-watchDone
		if !lock.acquired.Load() {
			return nil // Run returns without leading only when ctx ended
		}
		<-finished
		if runErr != nil {
			return fmt.Errorf("while leading: %w", runErr)
		}
	}
	return nil
}

// acquireLock records whether this replica ever wrote itself into the
// Lease as holder: the sign that the elector acquired it and started
// OnStartedLeading.
type acquireLock struct {
	resourcelock.Interface
	acquired atomic.Bool
}

func (l *acquireLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
	return err
}

func (l *acquireLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, r)
	if err == nil && r.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
	return err
}
