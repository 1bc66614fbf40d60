package e2e

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// sentinelRecovery is how long after the Sentinels promoted the replica
// both brokers must be placing again: the "few seconds" past the failover
// time (go-redis learns the new master from the Sentinels' switch-master
// message or its next dial; the first placement may wait out one
// --redis-wait-timeout for a replica that is gone).
const sentinelRecovery = 5 * time.Second

// TestSentinelFailoverLosesNoPlacement runs two brokers on a Redis master,
// its replica and three Sentinels, SIGKILLs the master while 50 creates run
// at once through both brokers, and checks that the brokers place again
// within the failover time plus a few seconds, that every server whose
// create was answered 2xx exists afterwards with its slice and runs, and
// that pods and allocations agree with no GPU overcommitted: every
// placement a pod was created for was on the replica (WAIT) when the
// master died.
func TestSentinelFailoverLosesNoPlacement(t *testing.T) {
	t.Parallel()
	f := redistest.StartFailover(t, redistest.FailoverOptions{DownAfter: time.Second})
	// Eight GPUs (10 small slices each) hold the 50 creates and the probes, so
	// a probe after the failover finds room whatever share got through.
	e := newEnv(t, envOptions{nodes: 2, gpusPerNode: 4, redis: &harness.BrokerOptions{
		RedisSentinelMaster: f.MasterName, RedisSentinelAddrs: f.SentinelAddrs()}})
	brokers := []*harness.Broker{e.broker, e.startBroker()}
	ctx := t.Context()
	oldMaster := f.Master.Addr()
	start := time.Now()

	type outcome struct {
		user, name string
		err        error
	}
	const creates, killAfter = 50, 10
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		answered int
		results  []outcome
		killed   = make(chan time.Time, 1)
		killOnce sync.Once
		go1      = make(chan struct{})
	)
	kill := func() {
		killOnce.Do(func() {
			f.Master.Kill()
			killed <- time.Now()
		})
	}
	for i := range creates {
		user, name := fmt.Sprintf("user%d", i/2), fmt.Sprintf("nb%d", i%2)
		cl := e.client(user)
		cl.BaseURL = brokers[i%len(brokers)].URL
		wg.Go(func() {
			<-go1
			_, _, err := cl.CreateServer(ctx, user, name, "k-"+user+"-"+name, v1.CreateServerRequest{Profile: "small"})
			mu.Lock()
			defer mu.Unlock()
			results = append(results, outcome{user, name, err})
			if err == nil {
				if answered++; answered == killAfter {
					go kill()
				}
			}
		})
	}
	close(go1)
	wg.Wait()
	kill() // in case fewer than killAfter were answered
	killedAt := <-killed

	newMaster, err := f.WaitNewMaster(ctx, oldMaster, 30*time.Second)
	if err != nil {
		t.Fatalf("no failover: %v", err)
	}
	promoted := time.Now()
	failover := promoted.Sub(killedAt)

	// Each broker places again: a probe create through it succeeds.
	for i, b := range brokers {
		user := fmt.Sprintf("probe%d", i)
		cl := e.client(user)
		cl.BaseURL = b.URL
		err := harness.Poll(ctx, 50*time.Millisecond, failover+sentinelRecovery+30*time.Second, func(ctx context.Context) (bool, string, error) {
			_, _, err := cl.CreateServer(ctx, user, "nb", "k-"+user, v1.CreateServerRequest{Profile: "small"})
			if err != nil {
				return false, err.Error(), nil
			}
			return true, "", nil
		})
		if err != nil {
			t.Fatalf("broker %d does not place after the failover: %v\n%s", i, err, b.LogTail(30))
		}
		if after := time.Since(promoted); after > sentinelRecovery {
			t.Errorf("broker %d placed again %s after the new master was promoted, want within %s", i, after.Round(time.Millisecond), sentinelRecovery)
		} else {
			t.Logf("broker %d places again %s after the promotion", i, after.Round(time.Millisecond))
		}
	}
	t.Logf("master %s killed after %d answered creates; Sentinel promoted %s after %s", oldMaster, killAfter, newMaster, failover.Round(time.Millisecond))

	mu.Lock()
	var ok []outcome
	failures := map[string]int{}
	example := map[string]string{}
	for _, r := range results {
		var ae *harness.APIError
		switch {
		case r.err == nil:
			ok = append(ok, r)
		case errors.As(r.err, &ae):
			k := fmt.Sprintf("%d %s", ae.Status, ae.Body.Code)
			failures[k]++
			example[k] = ae.Body.Message
		default:
			failures["no answer"]++
		}
	}
	mu.Unlock()
	t.Logf("creates: %d answered 2xx, refused or failed: %v (for example %v)", len(ok), failures, example)
	if len(ok) < killAfter {
		t.Errorf("only %d creates were answered 2xx; the master was to be killed after %d", len(ok), killAfter)
	}

	err = harness.Poll(ctx, 250*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		var problems []string
		for _, r := range ok {
			s, err := e.client(r.user).GetServer(ctx, r.user, r.name)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%s/%s: %v", r.user, r.name, err))
			case s.State != v1.StateRunning || s.GPU == nil || s.Slice.MemoryMiB == 0:
				problems = append(problems, fmt.Sprintf("%s/%s is %s (%s), GPU %v", r.user, r.name, s.State, s.Message, s.GPU))
			}
		}
		if len(problems) > 0 {
			sort.Strings(problems)
			return false, strings.Join(problems, "; "), nil
		}
		return e.allocationsMatchPods(t, ctx)
	})
	if err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	t.Logf("TestSentinelFailoverLosesNoPlacement took %s", time.Since(start).Round(100*time.Millisecond))
}
