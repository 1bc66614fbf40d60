package redisstore

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestDeviceCountersAgreeWithLua stores a device's counters with lib.lua's
// gpu_store on redis-server (Redis's struct library) and on miniredis (dev
// mode: the plain-Lua fallback), reads them back with gpu_counters and
// with Go's deviceCounters, and does the same for the decimal fields
// amem acp n of an earlier build, which gpu_store replaces. A use field of
// another length is an error on both sides.
func TestDeviceCountersAgreeWithLua(t *testing.T) {
	mr := miniredis.RunT(t)
	dev := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = dev.Close() })
	srv := redistest.Start(t)
	backends := map[string]*redis.Client{"redis-server": srv.Client(t), "miniredis": dev}
	key := srv.Prefix(t) + "gpu:GPU-1"
	// KEYS[1] device key; ARGV: "store" n amem acp, or "load". Returns the
	// counters gpu_counters reads before the store (and legacy "1"/"0"),
	// then the hash after it; the store sets shape to n too (gpu_store's
	// further field-value pairs).
	script := libConsts + libLua + `
local amem, acp, n, legacy = gpu_counters(KEYS[1], redis.call('HGET', KEYS[1], 'use'))
local read = string.format('%d %d %d %s', n, amem, acp, legacy and '1' or '0')
if ARGV[1] == 'store' then
  gpu_store(KEYS[1], {n = tonumber(ARGV[2]), amem = tonumber(ARGV[3]), acp = tonumber(ARGV[4]), legacy = legacy}, 'shape', ARGV[2])
end
return {read, redis.call('HGETALL', KEYS[1])}`
	run := func(t *testing.T, rdb *redis.Client, args ...any) (string, map[string]string) {
		t.Helper()
		res, err := rdb.Eval(t.Context(), script, []string{key}, args...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		h, err := flatMap(res[1])
		if err != nil {
			t.Fatal(err)
		}
		return res[0].(string), h
	}
	for name, rdb := range backends {
		t.Run(name, func(t *testing.T) {
			for _, want := range []usage{{3, 1 << 40, 250}, {0, 0, 0}, {-2, -8192, -10}, {1<<31 - 1, 1 << 52, 1<<31 - 1}} {
				run(t, rdb, "store", want.servers, want.memMiB, want.computePercent)
				read, h := run(t, rdb, "load")
				if w := fmt.Sprintf("%d %d %d 0", want.servers, want.memMiB, want.computePercent); read != w {
					t.Errorf("gpu_counters after gpu_store %v = %s, want %s", want, read, w)
				}
				if got, err := deviceCounters(h); err != nil || got != want {
					t.Errorf("deviceCounters after gpu_store %v = %v, %v", want, got, err)
				}
				if h["shape"] != strconv.FormatInt(want.servers, 10) {
					t.Errorf("shape after gpu_store %v with shape %d = %q", want, want.servers, h["shape"])
				}
				if v := usageValue(int32(want.servers), want.memMiB, int32(want.computePercent)); h["use"] != v {
					t.Errorf("use after gpu_store %v = %q, want %q", want, h["use"], v)
				}
			}

			// An earlier build's decimal fields: read, then replaced.
			if err := rdb.HDel(t.Context(), key, "use").Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(t.Context(), key, "amem", "2048", "acp", "30", "n", "2").Err(); err != nil {
				t.Fatal(err)
			}
			read, h := run(t, rdb, "load")
			if read != "2 2048 30 1" {
				t.Errorf("gpu_counters of the decimal fields = %s, want 2 2048 30 legacy", read)
			}
			if got, err := deviceCounters(h); err != nil || got != (usage{2, 2048, 30}) {
				t.Errorf("deviceCounters of the decimal fields = %v, %v", got, err)
			}
			_, h = run(t, rdb, "store", 3, 3072, 40)
			for _, f := range []string{"amem", "acp", "n"} {
				if h[f] != "use" {
					t.Errorf("gpu_store left the decimal field %s = %q, want it marked \"use\"", f, h[f])
				}
			}
			if got, err := deviceCounters(h); err != nil || got != (usage{3, 3072, 40}) {
				t.Errorf("deviceCounters after replacing the decimal fields = %v, %v", got, err)
			}

			if err := rdb.HSet(t.Context(), key, "use", "short").Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := rdb.Eval(t.Context(), script, []string{key}, "load").Result(); err == nil {
				t.Error("gpu_counters read a 5-byte use field")
			}
			if _, err := deviceCounters(map[string]string{"use": "short"}); err == nil {
				t.Error("deviceCounters read a 5-byte use field")
			}
			if err := rdb.Del(t.Context(), key).Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDeviceCountersOfEarlierBuildsAreReadAndStoredBinary: a device whose
// counters an earlier build wrote as the decimal fields amem acp n (no use
// field) is placed on within its compute (the walk and the capacity
// refusal read them), and the next place, release or registration stores
// them binary in use; Verify accepts both forms.
func TestDeviceCountersOfEarlierBuildsAreReadAndStoredBinary(t *testing.T) {
	rdb, s, gpu, key := oneH200(t)
	// toLegacy rewrites the device's counters as an earlier build stored them.
	toLegacy := func() {
		t.Helper()
		h, err := rdb.HGetAll(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		c, err := deviceCounters(h)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.HDel(t.Context(), key, "use").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(t.Context(), key, "amem", strconv.FormatInt(c.memMiB, 10), "acp", strconv.FormatInt(c.computePercent, 10),
			"n", strconv.FormatInt(c.servers, 10)).Err(); err != nil {
			t.Fatal(err)
		}
		verify(t, s)
	}
	// wantBinary fails t unless the device holds want in use and its
	// decimal fields are no numbers an earlier build's scripts could read
	// (Lua's tonumber gives nil), also after such a build's registration
	// (HSETNX amem 0).
	wantBinary := func(step string, want string) {
		t.Helper()
		if err := rdb.HSetNX(t.Context(), key, "amem", 0).Err(); err != nil {
			t.Fatal(err)
		}
		h, err := rdb.HGetAll(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if h["use"] != want {
			t.Errorf("after %s: use = %q, want %q", step, h["use"], want)
		}
		for _, f := range []string{"amem", "acp", "n"} {
			n, err := rdb.Eval(t.Context(), "return tostring(tonumber(redis.call('HGET', KEYS[1], ARGV[1])))", []string{key}, f).Text()
			if err != nil || n != "nil" {
				t.Errorf("after %s: an earlier build reads the decimal field %s (%q) as %q, %v; want no number", step, f, h[f], n, err)
			}
		}
		verify(t, s)
	}

	wantBinary("the first registration", usageValue(0, 0, 0))
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "a", User: "alice", Slice: slice(1024, 90)})
	toLegacy()
	_, err := s.Place(t.Context(), fleet.PlaceRequest{SliceID: "b", User: "alice", Slice: slice(1024, 20)})
	var ce *fleet.CapacityError
	if !errors.As(err, &ce) || ce.LargestFreeComputePercent != 10 {
		t.Fatalf("a place of 20%% on a device with 90%% taken (decimal fields) = %v, want the capacity refusal with 10%% free", err)
	}
	mustPlace(t, s, fleet.PlaceRequest{SliceID: "c", User: "alice", Slice: slice(1024, 10)})
	wantBinary("a place", usageValue(2, 2048, 100))

	toLegacy()
	if ok, err := s.Release(t.Context(), "a"); err != nil || !ok {
		t.Fatalf("Release(a) = %v, %v", ok, err)
	}
	wantBinary("a release", usageValue(1, 1024, 10))

	toLegacy()
	register(t, s, gpu)
	wantBinary("a registration", usageValue(1, 1024, 10))
}

// TestUnreadableDeviceCountersChangeNothing: a device whose use field is
// not 16 bytes makes a health change and a registration fail before they
// write anything (Redis keeps a failed script's earlier writes), so the
// device does not end up unhealthy while still in an index placement
// trusts, nor with half an inventory update.
func TestUnreadableDeviceCountersChangeNothing(t *testing.T) {
	rdb, s, gpu, key := oneH200(t)
	if err := rdb.HSet(t.Context(), key, "use", "short").Err(); err != nil {
		t.Fatal(err)
	}
	before, err := rdb.HGetAll(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetGPUHealth(t.Context(), "GPU-1", false); err == nil {
		t.Error("SetGPUHealth on a device with a 5-byte use field succeeded")
	}
	moved := gpu
	moved.Node = "n2"
	if err := s.RegisterGPU(t.Context(), moved); err == nil {
		t.Error("RegisterGPU on a device with a 5-byte use field succeeded")
	}
	after, err := rdb.HGetAll(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(before, after) {
		t.Errorf("the failed scripts wrote: before %q, after %q", before, after)
	}
}

// oneH200 starts a redis-server with a Store on it, registers one H200
// (GPU-1 on node n1) and returns the client, the Store, the GPU and its
// device key.
func oneH200(t *testing.T) (*redis.Client, *Store, fleet.GPU, string) {
	t.Helper()
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	gpu := h200("GPU-1", "n1")
	register(t, s, gpu)
	return srv.Client(t), s, gpu, s.k.GPU("GPU-1")
}
