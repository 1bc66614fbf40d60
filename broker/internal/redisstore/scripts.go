package redisstore

import (
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// The scripts. lib.lua and servers.lua hold helpers and are prepended to the
// scripts that use them; each script file states its KEYS/ARGV/returns
// contract. All keys a script touches share one hash tag (broker/api/redisschema).
var (
	//go:embed scripts/lib.lua
	libLua string
	//go:embed scripts/servers.lua
	serversLua string
	//go:embed scripts/place.lua
	placeLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/batch.lua
	batchLua string
	//go:embed scripts/restore.lua
	restoreLua string
	//go:embed scripts/register.lua
	registerLua string
	//go:embed scripts/health.lua
	healthLua string
	//go:embed scripts/set_mode.lua
	setModeLua string
	//go:embed scripts/verify.lua
	verifyLua string
	//go:embed scripts/create_server.lua
	createServerLua string
	//go:embed scripts/restore_server.lua
	restoreServerLua string
	//go:embed scripts/transition.lua
	transitionLua string
	//go:embed scripts/delete_server.lua
	deleteServerLua string
	//go:embed scripts/discard_server.lua
	discardServerLua string
	//go:embed scripts/save_policy.lua
	savePolicyLua string
	//go:embed scripts/extend_idle.lua
	extendIdleLua string
	//go:embed scripts/release_lock.lua
	releaseLockLua string
	//go:embed scripts/mark_reconciled.lua
	markReconciledLua string
)

// libConsts goes ahead of lib.lua: the names Go and the scripts share that
// are the same on every call, so they are part of the script's text rather
// than ARGV (each argument costs Redis a Lua string per call). USER_FIELD
// and GROUP_FIELD are the usage field prefixes, USAGE_FORMAT the struct
// format of a usage field's value, ALL_MODES every sharing mode,
// space-separated (keys.go). strconv.Quote of these ASCII strings is a Lua
// string literal.
var libConsts = "local USER_FIELD, GROUP_FIELD, USAGE_FORMAT, ALL_MODES = " + strconv.Quote(userFieldPrefix) + ", " +
	strconv.Quote(groupFieldPrefix) + ", " + strconv.Quote(usageFormat) + ", " + strconv.Quote(allModes) + "\n"

var (
	placeScript          = opScript(placeLua, "place")
	releaseScript        = opScript(releaseLua, "release")
	placeBatchScript     = batchScript(placeLua, "place")
	releaseBatchScript   = batchScript(releaseLua, "release")
	restoreScript        = redis.NewScript(libConsts + libLua + restoreLua)
	registerScript       = redis.NewScript(libConsts + libLua + registerLua)
	healthScript         = redis.NewScript(libConsts + libLua + healthLua)
	setModeScript        = redis.NewScript(libConsts + libLua + setModeLua)
	verifyScript         = redis.NewScript(verifyLua)
	createServerScript   = redis.NewScript(serversLua + createServerLua)
	restoreServerScript  = redis.NewScript(serversLua + restoreServerLua)
	transitionScript     = redis.NewScript(serversLua + transitionLua)
	deleteServerScript   = redis.NewScript(serversLua + deleteServerLua)
	discardServerScript  = redis.NewScript(serversLua + discardServerLua)
	savePolicyScript     = redis.NewScript(savePolicyLua)
	extendIdleScript     = redis.NewScript(extendIdleLua)
	releaseLockScript    = redis.NewScript(releaseLockLua)
	markReconciledScript = redis.NewScript(markReconciledLua)
)

// opScript is the script that runs fn, the operation that the script
// source src defines (place.lua, release.lua: lib.lua's helpers, fn's
// own KEYS and ARGV), once.
func opScript(src, fn string) *redis.Script {
	return redis.NewScript(libConsts + libLua + src + "\nreturn " + fn + "(KEYS, ARGV)\n")
}

// batchScript is the script that runs fn, defined by src as for
// opScript, once per operation of a batch (batch.lua, batch.go).
func batchScript(src, fn string) *redis.Script {
	return redis.NewScript(libConsts + libLua + src + "\nlocal one = " + fn + "\n" + batchLua)
}

// The helpers below check the type of every part of a script's reply; a
// reply of an unexpected shape is an error, never a panic.

// asList returns v as a Lua table reply.
func asList(v any) ([]any, error) {
	l, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("script reply is %T, want an array", v)
	}
	return l, nil
}

// asString returns v as a bulk string reply.
func asString(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("script reply element is %T, want a string", v)
	}
	return s, nil
}

// asInt returns v as an integer reply.
func asInt(v any) (int64, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("script reply is %T, want an integer", v)
	}
	return n, nil
}

// tagged splits a {"tag", ...} reply into its tag and the rest.
func tagged(v any) (string, []any, error) {
	l, err := asList(v)
	if err != nil {
		return "", nil, err
	}
	if len(l) == 0 {
		return "", nil, fmt.Errorf("script reply is an empty array")
	}
	tag, err := asString(l[0])
	if err != nil {
		return "", nil, err
	}
	return tag, l[1:], nil
}

// stringsN returns the first n elements of rest, which must be strings.
func stringsN(rest []any, n int) ([]string, error) {
	if len(rest) < n {
		return nil, fmt.Errorf("script reply has %d fields, want %d", len(rest), n)
	}
	out := make([]string, n)
	for i := range n {
		s, err := asString(rest[i])
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// flatMap turns an HGETALL reply made inside a script (a flat array of
// field, value) into a map.
func flatMap(v any) (map[string]string, error) {
	l, err := asList(v)
	if err != nil {
		return nil, err
	}
	if len(l)%2 != 0 {
		return nil, fmt.Errorf("hash reply has an odd number (%d) of elements", len(l))
	}
	m := make(map[string]string, len(l)/2)
	for i := 0; i < len(l); i += 2 {
		k, err := asString(l[i])
		if err != nil {
			return nil, err
		}
		val, err := asString(l[i+1])
		if err != nil {
			return nil, err
		}
		m[k] = val
	}
	return m, nil
}

// quotaReply decodes the rest of the "quota" reply of place.lua and
// resize.lua (scope, name, resource, limit, used, want) into the refusal.
func quotaReply(rest []any) (*fleet.QuotaError, error) {
	f, err := stringsN(rest, 6)
	if err != nil {
		return nil, err
	}
	qe := &fleet.QuotaError{Scope: f[0], Name: f[1], Resource: f[2]}
	var errs []error
	for i, dst := range []*int64{&qe.Limit, &qe.Used, &qe.Want} {
		n, err := atoi64(f[2], f[3+i])
		errs = append(errs, err)
		*dst = n
	}
	return qe, errors.Join(errs...)
}

// atoi64 parses a decimal integer from a script reply or hash field.
func atoi64(field, s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("field %s: %w", field, err)
	}
	return n, nil
}
