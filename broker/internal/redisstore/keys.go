package redisstore

import (
	"encoding/binary"
	"strconv"
	"strings"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// Keys. Every key this package touches is built by redisschema.Keys (the
// table of key, type, TTL and owner is there), under the configured prefix
// and the one hash tag {gpubroker}, so every multi-key script runs on one
// Cluster slot. Scripts that reach keys they cannot list in KEYS up front
// (the GPU that a placement walk finds, the GPU of a released slice) build
// them from Keys.GPUPrefix, passed in ARGV; those keys are in the same slot
// too.
//
// GPU records have no TTL: they are inventory, refreshed by the agents, and a
// GPU that leaves the fleet is expected to be marked unhealthy. The index,
// allocation and counter keys are derived data: they are rebuilt from pods
// by the reconciler after a flush and never orphaned (counters are deleted at
// zero).

// scopeIndexes returns the avail and full indexes of pool that a placement
// constrained to model ("" = any) uses.
func scopeIndexes(k redisschema.Keys, pool, model string) (avail, full string) {
	if model == "" {
		return k.AllAvail(pool), k.AllFull(pool)
	}
	return k.AvailIndex(pool, model), k.FullIndex(pool, model)
}

// modeSets returns the GPU set of every sharing mode, in v1.SharingModes
// order (sliced, exclusive, mig, mps).
func modeSets(k redisschema.Keys) []string {
	out := make([]string, len(v1.SharingModes))
	for i, m := range v1.SharingModes {
		out[i] = k.ModeGPUs(string(m))
	}
	return out
}

// allModes is every sharing mode, space-separated, as place.lua counts
// their GPU sets for a capacity refusal (ALL_MODES, libConsts).
var allModes = func() string {
	names := make([]string, len(v1.SharingModes))
	for i, m := range v1.SharingModes {
		names[i] = string(m)
	}
	return strings.Join(names, " ")
}()

// Field prefixes in the usage hash. A subject has one field,
// <prefix><name>, holding its counters in usageFormat (scripts/lib.lua
// reads and writes it, parseUsage decodes it); the prefixes keep a user
// and a group of the same name apart. place.lua,
// release.lua and resize.lua build the fields from these prefixes, which
// libConsts (scripts.go) puts in their text as USER_FIELD and GROUP_FIELD.
const (
	userFieldPrefix  = "u:"
	groupFieldPrefix = "g:"
)

func userUsage(user string) string   { return userFieldPrefix + user }
func groupUsage(group string) string { return groupFieldPrefix + group }

// usageFormat is the struct format (Redis's Lua struct library) of a usage
// field's value: servers as a signed 32-bit integer, MiB as a signed
// 64-bit integer and compute percent as a signed 32-bit integer,
// little-endian, usageSize bytes. Binary, because the scripts then read
// and write it with one C call each (lib.lua's usage_load).
const usageFormat = "<i4i8i4"

// usageSize is the length of a value in usageFormat.
const usageSize = 16

// usageWant describes usageFormat in errors about a malformed field.
const usageWant = "16 bytes: servers int32, MiB int64, compute percent int32, little-endian"

// parseUsage decodes a usage field's value: usageFormat (usageSize bytes,
// the top byte of MiB 0 or 255, as for any count below 2^56), or the
// decimal text "<servers> <MiB> <compute percent>" that builds before the
// binary counters wrote (none of its bytes is 0 or 255; the scripts store
// such a field binary when they next write it). ok is false for anything
// else.
func parseUsage(val string) (u usage, ok bool) {
	if len(val) == usageSize && (val[11] == 0 || val[11] == 255) {
		return unpackUsage(val), true
	}
	f := strings.Split(val, " ")
	if len(f) != 3 {
		return usage{}, false
	}
	var n [3]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || s[0] == '+' {
			return usage{}, false
		}
		n[i] = v
	}
	return usage{servers: n[0], memMiB: n[1], computePercent: n[2]}, true
}

// unpackUsage decodes usageSize bytes of usageFormat, as lib.lua's
// usage_unpack does; val must be usageSize bytes long.
func unpackUsage(val string) usage {
	b := []byte(val)
	return usage{
		servers:        int64(int32(binary.LittleEndian.Uint32(b[0:4]))),
		memMiB:         int64(binary.LittleEndian.Uint64(b[4:12])),
		computePercent: int64(int32(binary.LittleEndian.Uint32(b[12:16]))),
	}
}
