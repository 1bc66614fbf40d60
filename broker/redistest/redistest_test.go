package redistest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/broker/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartServesAndRestartLosesData(t *testing.T) {
	srv := redistest.Start(t)
	if strings.HasSuffix(srv.Addr(), ":6379") {
		t.Fatalf("Addr() = %s, want an ephemeral port", srv.Addr())
	}
	c := srv.Client(t)
	ctx := t.Context()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}
	cfg, err := c.ConfigGet(ctx, "save").Result()
	if err != nil {
		t.Fatalf("CONFIG GET save: %v", err)
	}
	if cfg["save"] != "" {
		t.Errorf("save = %q, want persistence off", cfg["save"])
	}

	srv.Restart()
	if _, err := c.Get(ctx, "k").Result(); !errors.Is(err, redis.Nil) {
		// The first command after a restart may fail on the dead pooled
		// connection; the retry must then see an empty server.
		if _, err := c.Get(ctx, "k").Result(); !errors.Is(err, redis.Nil) {
			t.Fatalf("GET after Restart: err = %v, want redis.Nil", err)
		}
	}

	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", srv.URL(), err)
	}
	if opt.Addr != srv.Addr() {
		t.Errorf("URL addr = %s, want %s", opt.Addr, srv.Addr())
	}
}

func TestStopIsIdempotentAndEndsProcess(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	srv.Stop()
	srv.Stop()
	noRetry := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer noRetry.Close()
	if err := noRetry.Ping(t.Context()).Err(); err == nil {
		t.Fatal("PING after Stop succeeded, want an error")
	}
}

func TestPrefixUniquePerCall(t *testing.T) {
	seen := map[string]bool{}
	for range 3 {
		t.Run("sub/with spaces*?[]{}", func(t *testing.T) {
			p := redistest.Prefix(t)
			if seen[p] {
				t.Fatalf("Prefix %q returned twice", p)
			}
			seen[p] = true
			if strings.ContainsAny(p, "*?[]{}\\ ") {
				t.Errorf("Prefix %q contains glob, hash-tag or space characters", p)
			}
		})
	}
}

func TestStartProcessMissingBinary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-redis-server")
	t.Setenv("GPUBROKER_TEST_REDIS_SERVER", missing)
	p, err := redistest.StartProcess(t.Context(), t.TempDir())
	if err == nil {
		p.Stop()
		t.Fatal("StartProcess with a missing binary succeeded")
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want one wrapping os.ErrNotExist", err)
	}
}
