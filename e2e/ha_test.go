package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// The HA test's Lease: short, so that a takeover is seconds. The broker
// gives its renewals two thirds of it (RenewDeadline) and retries every
// 2/15 of it (RetryPeriod).
const (
	haLeaseDuration = 4 * time.Second
	haRetryPeriod   = haLeaseDuration * 2 / 15
	haReclaimEvery  = 5 * time.Second // --reclaim-interval's least
	haShutdown      = 10 * time.Second
)

// TestThreeReplicas runs three broker replicas on one Redis and the real
// API server, with the reclaimer under the Lease:
//   - creates racing across the replicas never overcommit (raceCreates,
//     each create sent to a replica of its own);
//   - after a SIGKILL of the replica holding the Lease, another holds it,
//     not before the dead holder's Lease expired, and the
//     reclaimer's next passes run once each, and the reconciler's periodic
//     passes run, on the new holder only;
//   - a rolling restart (SIGTERM, graceful; start; next) of all three
//     under a steady create/delete load loses no request answered 2xx:
//     every server created with a 2xx exists afterwards, running unless its
//     delete got a 2xx, then stopped; every replica exits 0 within its
//     shutdown budget with its event streams ended cleanly.
func TestThreeReplicas(t *testing.T) {
	t.Parallel()
	args := []string{"--lease-duration=" + haLeaseDuration.String(), "--reclaim-interval=" + haReclaimEvery.String(),
		"--shutdown-timeout=" + haShutdown.String()}
	e := newEnv(t, envOptions{nodes: 2, gpusPerNode: 2, leaderElection: true, brokerArgs: args})
	replicas := []*harness.Broker{e.broker, e.startBroker(args...), e.startBroker(args...)}
	start := time.Now()

	t.Run("racing creates never overcommit", func(t *testing.T) {
		raceCreates(t, e, func(_ string, i int) string { return replicas[i%len(replicas)].URL })
		e.stopAll(t)
	})
	t.Run("the reclaim leader is SIGKILLed", func(t *testing.T) {
		killLeader(t, e, replicas)
	})
	t.Run("rolling restart under load", func(t *testing.T) {
		rollingRestart(t, e, replicas)
	})
	t.Logf("TestThreeReplicas took %s", time.Since(start).Round(100*time.Millisecond))
}

// killLeader SIGKILLs the replica the metrics name as the reclaim leader,
// and restarts it at the end.
func killLeader(t *testing.T, e *env, replicas []*harness.Broker) {
	ctx := t.Context()
	leader, err := reclaimLeader(ctx, replicas)
	if err != nil {
		t.Fatalf("no single reclaim leader: %v", err)
	}
	var survivors []*harness.Broker
	for _, b := range replicas {
		if b != leader {
			survivors = append(survivors, b)
		}
	}
	before := cyclesOf(t, survivors)
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Cleanup(func() {
		if err := leader.Start(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("restart the killed leader: %v", err)
		}
	})
	leases := e.cluster.Client.CoordinationV1().Leases(e.ns)
	old, err := leases.Get(ctx, "gpubroker-reclaimer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldHolder, lastRenew := *old.Spec.HolderIdentity, old.Spec.RenewTime.Time

	var next *harness.Broker
	err = harness.Poll(ctx, 50*time.Millisecond, 3*haLeaseDuration, func(ctx context.Context) (bool, string, error) {
		leaders, err := leadersOf(ctx, survivors)
		if err != nil {
			return false, err.Error(), nil
		}
		if len(leaders) > 1 {
			return false, "", fmt.Errorf("%d survivors lead at once", len(leaders))
		}
		if len(leaders) == 1 {
			next = leaders[0]
		}
		return next != nil, "no survivor leads", nil
	})
	if err != nil {
		t.Fatalf("no survivor took the Lease: %v", err)
	}
	took := time.Since(killed)
	lease, err := leases.Get(ctx, "gpubroker-reclaimer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == oldHolder {
		t.Fatalf("the Lease is still held by the killed replica %s", oldHolder)
	}
	gap := lease.Spec.AcquireTime.Sub(lastRenew)
	t.Logf("killed leader %s; %s holds the Lease %s after the kill, %s after the dead holder's last renewal (lease duration %s, retry period %s)",
		oldHolder, *lease.Spec.HolderIdentity, took.Round(time.Millisecond), gap.Round(time.Millisecond), haLeaseDuration, haRetryPeriod)
	// What client-go's leaderelection (tryAcquireOrRenew, isLeaseValid)
	// guarantees about the takeover, all clocks here being this host's:
	//   - the record holds LeaseDurationSeconds, the configured duration
	//     in whole seconds (int(LeaseDuration / time.Second));
	//   - a candidate takes the Lease only on a try whose start (`now`,
	//     stamped before its Get and written as AcquireTime) is at least
	//     LeaseDurationSeconds after observedTime, its own clock when a Get
	//     first showed it the record changed;
	//   - "changed" compares the record as JSON, whose times are
	//     metav1.Time (RFC 3339, whole seconds): renewals within one second
	//     look alike, so observedTime may date from the first renewal
	//     stamped in the last renewal's second, not from the last one.
	//     A renewal is stamped before its Update lands, and lands before a
	//     Get shows it, so observedTime >= the last renewal's second.
	// Hence AcquireTime >= RenewTime truncated to the second +
	// LeaseDurationSeconds: up to 1 s less than a full lease after the last
	// renewal, never less than that. lastRenew is no later than the last
	// renewal (one in flight at the kill may land after the Get above),
	// which only loosens the bound. No upper bound on the takeover holds
	// in wall time: each try waits RetryPeriod to 2.2 RetryPeriod after
	// the previous one returned (wait.JitterUntil, JitterFactor 1.2, sliding)
	// and round trips are as slow as the machine; the Poll above shows that
	// a survivor takes over, and the time it took is logged.
	leaseSeconds := int32(haLeaseDuration / time.Second)
	if d := old.Spec.LeaseDurationSeconds; d == nil || *d != leaseSeconds {
		t.Errorf("the dead holder's Lease says it lasts %s, want the configured %d s", lastingOf(d), leaseSeconds)
	}
	expired := lastRenew.Truncate(time.Second).Add(time.Duration(leaseSeconds) * time.Second)
	if lease.Spec.AcquireTime.Time.Before(expired) {
		t.Errorf("the Lease was taken at %s, %s after its last renewal at %s, before it expired at %s (the renewal's second + %d s)",
			lease.Spec.AcquireTime.Format(time.StampMicro), gap, lastRenew.Format(time.StampMicro), expired.Format(time.StampMicro), leaseSeconds)
	}

	// The reclaimer's next passes run once each, on the new holder.
	var other *harness.Broker
	for _, b := range survivors {
		if b != next {
			other = b
		}
	}
	for pass := 1; pass <= 2; pass++ {
		err := harness.Poll(ctx, 50*time.Millisecond, 2*haReclaimEvery+haLeaseDuration, func(ctx context.Context) (bool, string, error) {
			now := cyclesOf(t, survivors)
			if d := now[other] - before[other]; d != 0 {
				return false, "", fmt.Errorf("the replica without the Lease ran %v reclaim passes", d)
			}
			d := now[next] - before[next]
			if d > float64(pass) {
				return false, "", fmt.Errorf("the new holder ran %v passes where %d were due", d, pass)
			}
			return d == float64(pass), fmt.Sprintf("%v passes", d), nil
		})
		if err != nil {
			t.Fatalf("reclaim pass %d after the takeover: %v", pass, err)
		}
	}

	// The reconciler's periodic passes follow the Lease too: the new
	// holder makes them (every second here), the other survivor none.
	passes := countsOf(t, survivors, "gpubroker_reconcile_passes_total")
	err = harness.Poll(ctx, 50*time.Millisecond, 20*time.Second, func(ctx context.Context) (bool, string, error) {
		now := countsOf(t, survivors, "gpubroker_reconcile_passes_total")
		if d := now[other] - passes[other]; d != 0 {
			return false, "", fmt.Errorf("the replica without the Lease made %v reconcile passes", d)
		}
		d := now[next] - passes[next]
		return d >= 3, fmt.Sprintf("%v reconcile passes on the new holder", d), nil
	})
	if err != nil {
		t.Fatalf("reconcile passes after the takeover: %v", err)
	}
}

// lastingOf names a Lease's LeaseDurationSeconds for a message.
func lastingOf(d *int32) string {
	if d == nil {
		return "nothing"
	}
	return fmt.Sprintf("%d s", *d)
}

// rollingRestart restarts every replica in turn (SIGTERM, wait for the
// exit, start, wait until ready) while workers create and delete servers
// through all of them, and then checks every 2xx answer's effect.
func rollingRestart(t *testing.T, e *env, replicas []*harness.Broker) {
	ctx := t.Context()
	// One long-lived server whose event stream each replica holds while it
	// is shut down.
	watcher := e.client("watcher")
	if _, _, err := watcher.CreateServer(ctx, "watcher", "nb", "", v1.CreateServerRequest{Profile: "small"}); err != nil {
		t.Fatal(err)
	}
	if _, err := watcher.WaitServer(ctx, "watcher", "nb", v1.StateRunning, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	ld := &load{e: e, replicas: replicas, created: map[string]bool{}, deleted: map[string]bool{}, deleting: map[string]bool{}}
	lctx, stop := context.WithCancel(ctx)
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() { ld.run(lctx, w) })
	}
	for i, b := range replicas {
		sctx, cancelStream := context.WithCancel(ctx)
		cl := *watcher
		cl.BaseURL = b.URL
		stream, err := cl.Events(sctx, "watcher", "nb", "")
		if err != nil {
			t.Fatalf("open an event stream on replica %d: %v", i, err)
		}
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := stream.Next(); err != nil {
					ended <- err
					return
				}
			}
		}()
		took, err := b.Shutdown(haShutdown + 5*time.Second)
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
		select {
		case err := <-ended:
			if !errors.Is(err, io.EOF) {
				t.Errorf("replica %d's event stream ended with %v, want a clean end of stream", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("replica %d's event stream still open 5 s after the replica exited", i)
		}
		cancelStream()
		stream.Close()
		t.Logf("replica %d shut down in %s (budget %s)", i, took.Round(time.Millisecond), haShutdown)
		if err := b.Start(ctx); err != nil {
			t.Fatalf("restart replica %d: %v", i, err)
		}
	}
	stop()
	workers.Wait()

	ld.mu.Lock()
	defer ld.mu.Unlock()
	t.Logf("load: %d creates and %d deletes answered 2xx, %d requests retried on another replica", len(ld.created), len(ld.deleted), ld.retried)
	if len(ld.created) < 10 {
		t.Errorf("only %d creates answered 2xx during the restart; the load did not run", len(ld.created))
	}
	keys := make([]string, 0, len(ld.created))
	for k := range ld.created {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	last := ""
	err := harness.Poll(ctx, 250*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		all, err := e.admin.AllServers(ctx)
		if err != nil {
			return false, last + " (then: " + err.Error() + ")", nil
		}
		byKey := map[string]v1.Server{}
		for _, s := range all {
			byKey[s.User+"/"+s.Name] = s
		}
		var problems []string
		for _, k := range keys {
			s, ok := byKey[k]
			// A delete sent but not answered (the load stopped during it)
			// may or may not have happened.
			want := []v1.ServerState{v1.StateRunning}
			switch {
			case ld.deleted[k]:
				want = []v1.ServerState{v1.StateStopped}
			case ld.deleting[k]:
				want = append(want, v1.StateStopped)
			}
			switch {
			case !ok:
				problems = append(problems, k+" is gone")
			case !slices.Contains(want, s.State):
				problems = append(problems, fmt.Sprintf("%s is %s (%s), want %v", k, s.State, s.Message, want))
			}
		}
		if len(problems) > 0 {
			last = fmt.Sprintf("%d problems: %s", len(problems), strings.Join(problems, "; "))
			return false, last, nil
		}
		return e.allocationsMatchPods(t, ctx)
	})
	if err != nil {
		t.Errorf("after the rolling restart: %v", err)
	}
}

// load creates and deletes servers through the replicas, each request sent
// to the next replica and retried on the next one when it got no answer
// or a 503 (a replica shutting down), and records what was answered 2xx.
type load struct {
	e        *env
	replicas []*harness.Broker

	mu               sync.Mutex
	created, deleted map[string]bool // user/name: answered 2xx
	deleting         map[string]bool // user/name: a delete was sent
	retried          int
	next             int
}

// run is one worker: create a server, delete it, again, until ctx ends.
func (l *load) run(ctx context.Context, w int) {
	for i := 0; ctx.Err() == nil; i++ {
		user, name := fmt.Sprintf("load%d-%d", w, i), "nb"
		cl := l.e.client(user)
		key := user + "/" + name
		if l.do(ctx, cl, func(c *harness.Client) (int, error) {
			_, status, err := c.CreateServer(ctx, user, name, "k-"+key, v1.CreateServerRequest{Profile: "small"})
			return status, err
		}) {
			l.mu.Lock()
			l.created[key] = true
			l.mu.Unlock()
		} else {
			continue
		}
		if i < 2 {
			continue // keep each worker's first two servers running
		}
		l.mu.Lock()
		l.deleting[key] = true
		l.mu.Unlock()
		if l.do(ctx, cl, func(c *harness.Client) (int, error) { return c.DeleteServer(ctx, user, name) }) {
			l.mu.Lock()
			l.deleted[key] = true
			l.mu.Unlock()
		}
	}
}

// do sends call to replica after replica until one answers 2xx (true) or
// refuses for good (false), or ctx ends.
func (l *load) do(ctx context.Context, cl *harness.Client, call func(c *harness.Client) (int, error)) bool {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		l.mu.Lock()
		b := l.replicas[l.next%len(l.replicas)]
		l.next++
		if attempt > 0 {
			l.retried++
		}
		l.mu.Unlock()
		c := *cl
		c.BaseURL = b.URL
		_, err := call(&c)
		var ae *harness.APIError
		switch {
		case err == nil:
			return true
		case errors.As(err, &ae) && ae.Status != http.StatusServiceUnavailable && ae.Status < 500:
			return false // refused for good: not a 2xx, nothing to check
		}
		select { // a replica restarting: try the next one
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// stopAll deletes every server through the admin API and waits until no
// pod is left.
func (e *env) stopAll(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	all, err := e.admin.AllServers(ctx)
	if err != nil {
		t.Fatalf("list servers: %v", err)
	}
	for _, s := range all {
		if _, err := e.admin.DeleteServer(ctx, s.User, s.Name); err != nil {
			t.Fatalf("delete %s/%s: %v", s.User, s.Name, err)
		}
	}
	err = harness.Poll(ctx, 100*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		pods, err := e.pods(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return len(pods) == 0 && len(e.allocated(t)) == 0, fmt.Sprintf("%d pods, allocations %v", len(pods), e.allocated(t)), nil
	})
	if err != nil {
		t.Fatalf("servers not stopped: %v", err)
	}
}

// leadersOf returns the replicas whose metrics say they run the reclaimer.
func leadersOf(ctx context.Context, bs []*harness.Broker) ([]*harness.Broker, error) {
	var out []*harness.Broker
	for _, b := range bs {
		m, err := scrape(ctx, b)
		if err != nil {
			return nil, err
		}
		if m["gpubroker_reclaim_leader"] == 1 {
			out = append(out, b)
		}
	}
	return out, nil
}

// cyclesOf returns each broker's reclaim passes so far (every result).
func cyclesOf(t *testing.T, bs []*harness.Broker) map[*harness.Broker]float64 {
	t.Helper()
	return countsOf(t, bs, "gpubroker_reclaim_cycles_total")
}

// countsOf returns each broker's counter so far, summed over its labels.
func countsOf(t *testing.T, bs []*harness.Broker, counter string) map[*harness.Broker]float64 {
	t.Helper()
	out := map[*harness.Broker]float64{}
	for _, b := range bs {
		m, err := scrape(t.Context(), b)
		if err != nil {
			t.Fatal(err)
		}
		out[b] = m.Sum(counter)
	}
	return out
}

// scrape reads a broker's /metrics.
func scrape(ctx context.Context, b *harness.Broker) (harness.Metrics, error) { return b.Scrape(ctx) }
