package redisstore

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestPlaceWaitsForAReplica proves what the Sentinel setup relies on
// (WithWaitReplicas(1)):
//   - every placement Place returned is already on the replica (read there
//     right after Place returned), so a failover that promotes the replica
//     keeps every slice a pod was created for;
//   - a replica that is online but does not acknowledge (frozen) makes the
//     placement a refusal, released again;
//   - the promoted replica, which has not cached the scripts, places on top
//     of the slices it holds without overcommitting, alone (nothing left
//     to fail over to: no wait) and with a new replica of its own (waiting
//     again, the script loaded on NOSCRIPT).
func TestPlaceWaitsForAReplica(t *testing.T) {
	ctx := t.Context()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master.Process)
	prefix := master.Prefix(t)
	s := New(master.Client(t), prefix, WithWaitReplicas(1, 300*time.Millisecond))
	if err := s.MarkReconciled(ctx); err != nil {
		t.Fatal(err)
	}
	register(t, s, h200("GPU-a", "n1"), h200("GPU-b", "n1"))
	onReplica := redis.NewClient(&redis.Options{Addr: replica.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = onReplica.Close() })

	const held = 30
	for i := range held {
		a := mustPlace(t, s, fleet.PlaceRequest{SliceID: fmt.Sprintf("w%02d", i), User: "alice", Slice: slice(4096, 5)})
		// Read at once: WAIT returned, so the replica has applied it.
		if err := onReplica.HGet(ctx, s.k.Allocs(), a.SliceID).Err(); err != nil {
			t.Fatalf("allocation %s is not on the replica right after Place returned: %v", a.SliceID, err)
		}
	}

	// Frozen: still online for the master, acknowledging nothing.
	if err := replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err := s.Place(ctx, fleet.PlaceRequest{SliceID: "frozen", User: "carol", Slice: slice(4096, 5)})
	if cerr := replica.Signal(syscall.SIGCONT); cerr != nil {
		t.Fatal(cerr)
	}
	if !errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("Place while the replica is frozen = %v, want fleet.ErrUnavailable", err)
	}
	t.Logf("refused after %s: %v", time.Since(t0), err)
	if _, err := s.Allocation(ctx, "frozen"); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("the refused placement is still allocated: %v", err)
	}
	verify(t, s)

	// Fail over as Sentinel would: the replica becomes the master, the old
	// master is gone.
	if err := onReplica.Do(ctx, "replicaof", "no", "one").Err(); err != nil {
		t.Fatalf("promote the replica: %v", err)
	}
	master.Kill()
	promoted := New(onReplica, prefix, WithWaitReplicas(1, 300*time.Millisecond))
	place := func(id string) error {
		_, err := promoted.Place(ctx, fleet.PlaceRequest{SliceID: id, User: "bob", Slice: slice(4096, 5)})
		return err
	}
	if err := place("alone"); err != nil {
		t.Fatalf("place on the promoted replica without replicas of its own: %v", err)
	}
	redistest.StartReplica(t, replica)
	more := 1
	for i := 0; ; i++ {
		err := place(fmt.Sprintf("p%02d", i))
		if errors.Is(err, fleet.ErrNoCapacity) {
			break
		}
		if err != nil {
			t.Fatalf("place on the promoted replica with a replica: %v", err)
		}
		more++
	}
	// 2 GPUs × 20 slices of 5 % compute; held were placed before.
	if more != 40-held {
		t.Errorf("the promoted replica placed %d more slices, want %d (40 fit, %d held)", more, 40-held, held)
	}
	verify(t, promoted)
}

func TestOnlineReplicas(t *testing.T) {
	info := "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n" +
		"slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n" +
		"slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\nmaster_replid:abc\r\n"
	if n := onlineReplicas(info); n != 1 {
		t.Errorf("onlineReplicas = %d, want 1 (one online, one still syncing)", n)
	}
}
