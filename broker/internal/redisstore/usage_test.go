package redisstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestUsageFormatAgreesWithLua packs counters with lib.lua's usage_pack on
// redis-server (Redis's struct library) and on miniredis (dev mode: the
// plain-Lua fallback), decodes them with parseUsage and with usage_unpack
// (and usageValue, which the tests write fields with, packs them alike); a
// value of another length is refused.
func TestUsageFormatAgreesWithLua(t *testing.T) {
	mr := miniredis.RunT(t)
	dev := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = dev.Close() })
	backends := map[string]*redis.Client{"redis-server": redistest.Start(t).Client(t), "miniredis": dev}
	script := libConsts + libLua + `
local v = usage_pack(USAGE_FORMAT, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
local s, m, c = usage_unpack(USAGE_FORMAT, v)
return {v, string.format('%d %d %d', s, m, c)}`
	for name, rdb := range backends {
		for _, want := range []usage{{3, 1 << 40, 250}, {1, 0, 0}, {-2, -8192, -10}, {1<<31 - 1, 1 << 52, 1<<31 - 1}, {-1 << 31, -1 << 52, -1}} {
			res, err := rdb.Eval(t.Context(), script, nil, want.servers, want.memMiB, want.computePercent).StringSlice()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if u, ok := parseUsage(res[0]); !ok || u != want {
				t.Errorf("%s: parseUsage(usage_pack %v) = %v, %v", name, want, u, ok)
			}
			if w := fmt.Sprintf("%d %d %d", want.servers, want.memMiB, want.computePercent); res[1] != w {
				t.Errorf("%s: usage_unpack(usage_pack %v) = %s", name, want, res[1])
			}
			if v := usageValue(int32(want.servers), want.memMiB, int32(want.computePercent)); v != res[0] {
				t.Errorf("%s: usageValue(%v) = %q, usage_pack made %q", name, want, v, res[0])
			}
		}
	}
	for _, text := range []usage{{1, 1024, 10}, {100, 10485760, 100}, {-1, 0, 0}} { // an earlier build's decimal text; 16 bytes too
		v := fmt.Sprintf("%d %d %d", text.servers, text.memMiB, text.computePercent)
		if u, ok := parseUsage(v); !ok || u != text {
			t.Errorf("parseUsage(%q) = %v, %v; want %v", v, u, ok, text)
		}
	}
	for _, bad := range []string{"", "1 1024", "1 1024 10 5", "1  1024 10", "+1 1024 10", strings.Repeat("x", 15), strings.Repeat("x", 16), strings.Repeat("x", 17)} {
		if u, ok := parseUsage(bad); ok {
			t.Errorf("parseUsage(%q) = %v, want refused", bad, u)
		}
	}
}

// TestDecimalUsageOfEarlierBuildsIsReadAndStoredBinary: a usage field that
// an earlier build wrote as decimal text ("<servers> <MiB> <percent>") is
// counted by the next place, which stores it binary; quotas hold across the
// change of format and Verify accepts both.
func TestDecimalUsageOfEarlierBuildsIsReadAndStoredBinary(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n1"))
	quota := fleet.Quota{Servers: 2}
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "a", User: "alice", Slice: slice(1024, 10), UserQuota: quota})
	if err := rdb.HSet(t.Context(), s.k.Usage(), userUsage("alice"), "1 1024 10").Err(); err != nil {
		t.Fatal(err)
	}
	verify(t, s)
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "b", User: "alice", Slice: slice(1024, 10), UserQuota: quota})
	got, err := rdb.HGet(t.Context(), s.k.Usage(), userUsage("alice")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := usageValue(2, 2048, 20); got != want {
		t.Errorf("alice's field after the place = %q, want it binary: %q", got, want)
	}
	_, err = s.Place(t.Context(), fleet.PlaceRequest{SliceID: "c", User: "alice", Slice: slice(1024, 10), UserQuota: quota})
	var qe *fleet.QuotaError
	if !errors.As(err, &qe) || qe.Used != 2 {
		t.Errorf("a third place = %v, want the servers quota refusal with 2 used", err)
	}
	verify(t, s)
}
