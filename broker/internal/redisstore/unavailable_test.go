package redisstore

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func TestUnavailableHookMarksOnlyErrorsOfARedisThatDidNotAnswer(t *testing.T) {
	ctx := t.Context()
	p, err := redistest.StartProcess(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(UnavailableHook{})
	s := New(rdb, "t")

	// Answers are left alone: a missing record, and a script that Redis
	// forgot (NOSCRIPT falls back to EVAL).
	if _, err := s.GetServer(ctx, fleet.ServerKey{User: "u", Name: "nb"}); !errors.Is(err, fleet.ErrNotFound) || errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("get a missing server = %v, want ErrNotFound only", err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReconcileEpoch(ctx); err != nil {
		t.Fatalf("epoch: %v", err)
	}
	if _, err := s.MarkReconciledAt(ctx, "x"); err != nil {
		t.Fatalf("script after SCRIPT FLUSH: %v", err)
	}
	if err := rdb.Get(ctx, "missing").Err(); !errors.Is(err, redis.Nil) || errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("GET missing = %v, want redis.Nil only", err)
	}

	p.Stop()
	_, err = s.GetServer(ctx, fleet.ServerKey{User: "u", Name: "nb"})
	if !errors.Is(err, fleet.ErrStoreUnavailable) || !errors.Is(err, fleet.ErrUnavailable) {
		t.Fatalf("get with Redis stopped = %v, want ErrStoreUnavailable", err)
	}
	pipe := rdb.Pipeline()
	get := pipe.Get(ctx, "k")
	if _, err := pipe.Exec(ctx); !errors.Is(err, fleet.ErrStoreUnavailable) || !errors.Is(get.Err(), fleet.ErrStoreUnavailable) {
		t.Fatalf("pipeline with Redis stopped = %v (command: %v), want ErrStoreUnavailable", err, get.Err())
	}
	if !errors.Is(unavailable(context.Canceled), context.Canceled) || errors.Is(unavailable(context.Canceled), fleet.ErrUnavailable) {
		t.Error("a cancelled context is the caller's, not an unavailable store")
	}
}
