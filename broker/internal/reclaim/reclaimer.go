package reclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// Servers is the server store the reclaimer reads and writes events
// through (implemented by redisstore.Store). Transition to the running
// state with a new message appends an event to the server's stream.
type Servers interface {
	ListServers(ctx context.Context, user string) ([]fleet.Server, error)
	Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error)
}

// Stopper stops a server without deleting its data (servers.Service.Delete).
type Stopper interface {
	Delete(ctx context.Context, key fleet.ServerKey) (fleet.Server, error)
}

// Shrinker sets a running server's compute share (guarantee and burst
// ceiling, percent of the GPU).
type Shrinker interface {
	SetCompute(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error
}

// ActivityProber reads a notebook server's own activity (*Prober).
type ActivityProber interface {
	Probe(ctx context.Context, url string) (Activity, error)
}

// HubNotifier tells JupyterHub that a server is in use (*Hub).
type HubNotifier interface {
	Activity(ctx context.Context, user, server string, at time.Time) error
}

// Actor is the audit actor of the reclaimer's own actions.
const Actor = "reclaimer"

// Audit actions written by the reclaimer.
const (
	AuditWarn    = "reclaim.warn"
	AuditShrink  = "reclaim.shrink"
	AuditRestore = "reclaim.restore"
	AuditStop    = "reclaim.stop"
	AuditExtend  = "reclaim.extend"
)

// Config holds a Reclaimer's dependencies and settings.
type Config struct {
	// Redis and Prefix hold the idle states (same prefix as the policy).
	Redis  redis.UniversalClient
	Prefix string
	// Policies is the policy and audit store.
	Policies *PolicyStore
	// Servers, Stopper, Shrinker and Prober are required.
	Servers  Servers
	Stopper  Stopper
	Shrinker Shrinker
	Prober   ActivityProber
	// Hub, when set, is told about servers whose GPU is busy.
	Hub HubNotifier
	// SampleKeys names the node agents' sample streams.
	SampleKeys redisschema.Keys
	// Interval is the time between cycles; 0 means 30 s. Activity within
	// the last Interval (at least 1 min) counts as current.
	Interval time.Duration
	// SamplesPerServer is how many of a slice's newest samples a cycle
	// reads; 0 means 30.
	SamplesPerServer int64
	// ProbeConcurrency bounds parallel notebook probes; 0 means 32.
	ProbeConcurrency int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives one line per cycle with errors; nil discards.
	Log *slog.Logger
}

// Reclaimer finds idle servers and warns, shrinks or stops them by the
// policy. One replica runs it (the composition root elects it with
// broker/internal/leader); Extend and State are safe from
// any replica. Safe for concurrent use.
type Reclaimer struct {
	rdb      redis.UniversalClient
	prefix   string
	policies *PolicyStore
	servers  Servers
	stopper  Stopper
	shrinker Shrinker
	prober   ActivityProber
	hub      HubNotifier
	keys     redisschema.Keys
	interval time.Duration
	lookback time.Duration
	nSamples int64
	probes   int
	now      func() time.Time
	log      *slog.Logger
}

// New checks cfg and returns a Reclaimer.
func New(cfg Config) (*Reclaimer, error) {
	if cfg.Redis == nil || cfg.Policies == nil || cfg.Servers == nil || cfg.Stopper == nil || cfg.Shrinker == nil || cfg.Prober == nil {
		return nil, errors.New("reclaim: redis, policies, servers, stopper, shrinker and prober are required")
	}
	r := &Reclaimer{rdb: cfg.Redis, prefix: cfg.Prefix, policies: cfg.Policies, servers: cfg.Servers, stopper: cfg.Stopper,
		shrinker: cfg.Shrinker, prober: cfg.Prober, hub: cfg.Hub, keys: cfg.SampleKeys, interval: cfg.Interval,
		nSamples: cfg.SamplesPerServer, probes: cfg.ProbeConcurrency, now: cfg.Now, log: cfg.Log}
	if r.interval <= 0 {
		r.interval = 30 * time.Second
	}
	r.lookback = max(r.interval, time.Minute)
	if r.nSamples <= 0 {
		r.nSamples = 30
	}
	if r.probes <= 0 {
		r.probes = 32
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// Run runs a cycle every Interval until ctx ends; a failed cycle is logged
// and the next one runs on time. It returns nil when ctx ends.
func (r *Reclaimer) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		if rep, err := r.Cycle(ctx); err != nil && ctx.Err() == nil {
			r.log.ErrorContext(ctx, "reclaim cycle", "err", err)
		} else if err == nil {
			r.log.DebugContext(ctx, "reclaim cycle", "servers", rep.Servers, "idle", rep.Idle, "unknown", rep.Unknown, "actions", rep.Actions)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// CycleReport counts what one cycle saw and did.
type CycleReport struct {
	Servers, Active, Idle, Unknown, Actions int
}

// act is one action decided for one server.
type act struct {
	audit   string // AuditWarn...; "" for an event without audit
	message string
	// compute and limit for shrink and restore.
	compute, limit int
	stop           bool
}

// Cycle classifies every running server once and takes the actions due.
// Errors of single actions are joined into the returned error after the
// whole cycle ran; the report counts what was done.
func (r *Reclaimer) Cycle(ctx context.Context) (CycleReport, error) {
	var rep CycleReport
	now := r.now().UTC()
	pol, err := r.policies.Get(ctx)
	if err != nil {
		return rep, err
	}
	all, err := r.servers.ListServers(ctx, "")
	if err != nil {
		return rep, fmt.Errorf("reclaim: %w", err)
	}
	var run []fleet.Server
	for _, s := range all {
		if s.State == v1.StateRunning && s.SpawnID != "" {
			run = append(run, s)
		}
	}
	rep.Servers = len(run)
	samples, states, seen, err := r.read(ctx, run, now.Add(-r.lookback))
	if err != nil {
		return rep, err
	}

	obs := make([]observation, len(run))
	effs := make([]Policy, len(run))
	exempt := make([]bool, len(run))
	var probe []int
	for i, s := range run {
		effs[i], exempt[i] = pol.Effective(s.User, s.Profile, serverGroups(s))
		in := map[string]string{}
		v, why := gpuEvidence(now, samples[i], effs[i].IdleComputePercent, r.lookback, in)
		obs[i] = observation{verdict: v, reason: why, inputs: in}
		if v == VerdictIdle {
			probe = append(probe, i)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.probes)
	for _, i := range probe {
		g.Go(func() error {
			a, perr := r.prober.Probe(gctx, run[i].URL)
			obs[i].verdict, obs[i].reason = notebookEvidence(now, a, perr, r.lookback, obs[i].inputs)
			return nil
		})
	}
	_ = g.Wait() // the probes return no errors; failures are verdicts

	var save []IdleState
	var errs []error
	for i, s := range run {
		next, acts := decide(now, s, pol, effs[i], exempt[i], obs[i], states[i], seen[i])
		switch next.Verdict {
		case VerdictActive:
			rep.Active++
		case VerdictIdle:
			rep.Idle++
		default:
			rep.Unknown++
		}
		failed := false
		for _, a := range acts {
			if err := r.do(ctx, now, s, pol, a, obs[i].inputs); err != nil {
				errs = append(errs, err)
				failed = true
				break
			}
			if a.audit != "" {
				rep.Actions++
			}
		}
		if failed {
			// Keep the ladder where it was; the next cycle tries again.
			next.Rung, next.WarnedAt, next.AgeWarnedAt, next.ShrunkFrom, next.ShrunkLimitFrom =
				states[i].Rung, states[i].WarnedAt, states[i].AgeWarnedAt, states[i].ShrunkFrom, states[i].ShrunkLimitFrom
		}
		if !seen[i] || changed(states[i], next) || now.Sub(states[i].CheckedAt) > 24*time.Hour {
			next.CheckedAt = now
			save = append(save, next)
		}
		if r.hub != nil && next.Verdict == VerdictActive && (next.Reason == reasonGPUBusy || next.Reason == reasonKernelLaunch) {
			if err := r.hub.Activity(ctx, s.User, s.Name, now); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := r.saveStates(ctx, save); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// serverGroups are the groups the broker knows for a server's user: the
// quota groups charged when it was placed.
func serverGroups(s fleet.Server) []string {
	if s.Allocation == nil {
		return nil
	}
	return s.Allocation.Groups
}

// changed reports whether next differs from prev in a stored field.
func changed(prev, next IdleState) bool {
	prev.CheckedAt, next.CheckedAt = time.Time{}, time.Time{}
	prev.ExtendedUntil, next.ExtendedUntil = time.Time{}, time.Time{}
	prev.Extended, next.Extended = 0, 0
	return prev != next
}

// read fetches, in pipelined batches, each server's newest samples (only
// the newest one and those taken after from are decoded) and its idle
// state; seen[i] is false when no state was stored for the spawn.
func (r *Reclaimer) read(ctx context.Context, run []fleet.Server, from time.Time) ([][]agentstore.Sample, []IdleState, []bool, error) {
	samples := make([][]agentstore.Sample, len(run))
	states := make([]IdleState, len(run))
	seen := make([]bool, len(run))
	const batch = 1000
	for lo := 0; lo < len(run); lo += batch {
		hi := min(lo+batch, len(run))
		xs := make([]*redis.XMessageSliceCmd, hi-lo)
		hs := make([]*redis.MapStringStringCmd, hi-lo)
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		_, err := r.rdb.Pipelined(octx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				xs[i-lo] = p.XRevRangeN(octx, r.keys.Samples(run[i].SpawnID), "+", "-", r.nSamples)
				hs[i-lo] = p.HGetAll(octx, r.stateKey(run[i].SpawnID))
			}
			return nil
		})
		cancel()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("reclaim: read samples and idle states: %w", err)
		}
		for i := lo; i < hi; i++ {
			id := run[i].SpawnID
			for _, m := range xs[i-lo].Val() {
				s, err := decodeBatchSample(id, m)
				if err != nil {
					break // a corrupt sample ends the usable history: older ones are not trusted either
				}
				samples[i] = append(samples[i], s)
				if s.At.Before(from) {
					break // older samples are outside the window
				}
			}
			if h := hs[i-lo].Val(); len(h) > 0 {
				states[i], seen[i] = decodeState(id, h), true
			} else {
				states[i] = IdleState{SpawnID: id}
			}
		}
	}
	return samples, states, seen, nil
}

// decide computes a server's next state and the actions due, from the
// top-level policy pol (enabled, dry-run, version), the effective policy
// eff, the observation and the previous state.
func decide(now time.Time, s fleet.Server, pol, eff Policy, exempt bool, ob observation, prev IdleState, seen bool) (IdleState, []act) {
	next := prev
	next.SpawnID, next.Exempt = s.SpawnID, exempt
	if !seen || next.FirstSeen.IsZero() {
		next.FirstSeen = now
	}
	if ob.verdict == VerdictIdle && eff.MinRunning > 0 && now.Before(next.FirstSeen.Add(eff.MinRunning)) {
		ob.verdict, ob.reason = VerdictActive, reasonMinRunning
	}
	if !seen || ob.verdict != prev.Verdict || ob.reason != prev.Reason {
		next.Since = now
	}
	next.Verdict, next.Reason = ob.verdict, ob.reason
	acting := pol.Enabled && !exempt
	var acts []act
	extended := now.Before(prev.ExtendedUntil)

	if ob.verdict != VerdictIdle || extended || !acting {
		if acting && ob.verdict == VerdictActive && !prev.WarnedAt.IsZero() && !pol.DryRun {
			acts = append(acts, act{message: "in use again (" + ob.reason + "); the idle countdown is cancelled"})
		}
		if prev.ShrunkFrom > 0 {
			acts = append(acts, act{audit: AuditRestore, compute: prev.ShrunkFrom, limit: prev.ShrunkLimitFrom,
				message: fmt.Sprintf("compute restored to %d %% of the GPU", prev.ShrunkFrom)})
			next.ShrunkFrom, next.ShrunkLimitFrom = 0, 0
		}
		next.Rung, next.WarnedAt = 0, time.Time{}
	}
	if !acting {
		return next, acts
	}

	// Maximum age: independent of activity.
	if eff.MaxAge > 0 {
		age := now.Sub(s.CreatedAt)
		switch {
		case age >= eff.MaxAge && (eff.Warn == 0 || (!prev.AgeWarnedAt.IsZero() && !now.Before(prev.AgeWarnedAt.Add(eff.Warn)))):
			return next, append(acts, act{audit: AuditStop, stop: true,
				message: fmt.Sprintf("running for %s, the maximum is %s; stopping the server (your files are kept)", durationText(age), durationText(eff.MaxAge))})
		case prev.AgeWarnedAt.IsZero() && eff.Warn > 0 && age >= eff.MaxAge-eff.Warn:
			at := maxTime(s.CreatedAt.Add(eff.MaxAge), now.Add(eff.Warn))
			next.AgeWarnedAt = now
			acts = append(acts, act{audit: AuditWarn,
				message: fmt.Sprintf("running for %s; will stop at %s, the maximum running time is %s (your files are kept)", durationText(age), clockText(at, now), durationText(eff.MaxAge))})
		}
	}
	if ob.verdict != VerdictIdle || extended {
		return next, acts
	}

	base := maxTime(next.Since, prev.ExtendedUntil)
	idle := now.Sub(base)
	rungs := ladder(eff)
	if next.Rung >= len(rungs) {
		return next, acts
	}
	rg := rungs[next.Rung]
	if idle < rg.At {
		return next, acts
	}
	if next.Rung > 0 && rungs[next.Rung-1].Action == ActionWarn && !next.WarnedAt.IsZero() && now.Before(next.WarnedAt.Add(eff.Warn)) {
		return next, acts // the warning's notice has not run out yet
	}
	next.Rung++
	switch rg.Action {
	case ActionWarn:
		at := maxTime(base.Add(rg.NextAt), now.Add(eff.Warn))
		next.WarnedAt = now
		acts = append(acts, act{audit: AuditWarn, message: warnText(idle, rg.Next, at, eff.ShrinkComputePercent, now)})
	case ActionShrink:
		next.WarnedAt = time.Time{}
		if s.Slice.ComputePercent <= eff.ShrinkComputePercent || next.ShrunkFrom > 0 {
			return next, acts // nothing to shrink
		}
		next.ShrunkFrom, next.ShrunkLimitFrom = s.Slice.ComputePercent, s.Slice.ComputeLimitPercent
		msg := fmt.Sprintf("idle for %s; compute shrunk to %d %% of the GPU until the server is busy again", durationText(idle), eff.ShrinkComputePercent)
		acts = append(acts, act{audit: AuditShrink, compute: eff.ShrinkComputePercent, limit: eff.ShrinkComputePercent, message: msg})
	case ActionStop:
		acts = append(acts, act{audit: AuditStop, stop: true,
			message: fmt.Sprintf("idle for %s; stopping the server (your files are kept)", durationText(idle))})
	}
	return next, acts
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// target is the audit target of a server.
func target(s fleet.Server) string { return "server:" + s.User + "/" + s.Name }

// do carries out a (unless the policy is a dry run) and audits it.
func (r *Reclaimer) do(ctx context.Context, now time.Time, s fleet.Server, pol Policy, a act, inputs map[string]string) error {
	if !pol.DryRun {
		var err error
		switch {
		case a.stop:
			if _, err = r.servers.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateRunning, a.message, fleet.ServerPatch{}); err == nil {
				_, err = r.stopper.Delete(ctx, s.ServerKey)
			}
		case a.compute > 0:
			if err = r.shrinker.SetCompute(ctx, s, a.compute, a.limit); err == nil {
				_, err = r.servers.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateRunning, a.message, fleet.ServerPatch{})
			}
		default:
			_, err = r.servers.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateRunning, a.message, fleet.ServerPatch{})
		}
		if err != nil {
			return fmt.Errorf("reclaim %s/%s: %s: %w", s.User, s.Name, a.audit, err)
		}
	}
	if a.audit == "" {
		return nil
	}
	in := maps.Clone(inputs)
	if in == nil {
		in = map[string]string{}
	}
	in["spawnId"] = s.SpawnID
	in["profile"] = s.Profile
	if pol.DryRun {
		in["dryRun"] = "true"
	}
	if a.compute > 0 {
		in["computePercent"] = strconv.Itoa(a.compute)
	}
	return r.policies.AppendAudit(ctx, AuditEntry{Time: now, Actor: Actor, Action: a.audit, Target: target(s),
		Reason: a.message, PolicyVersion: pol.Version, Inputs: in})
}

// State returns the idle state of srv's current spawn with its next step
// (NextAction, NextAt) under the current policy. A spawn the reclaimer
// has not seen yet has an empty Verdict.
func (r *Reclaimer) State(ctx context.Context, srv fleet.Server) (IdleState, error) {
	pol, err := r.policies.Get(ctx)
	if err != nil {
		return IdleState{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	h, err := r.rdb.HGetAll(ctx, r.stateKey(srv.SpawnID)).Result()
	if err != nil {
		return IdleState{}, fmt.Errorf("reclaim: idle state of %s/%s: %w", srv.User, srv.Name, err)
	}
	st := decodeState(srv.SpawnID, h)
	if len(h) == 0 {
		st = IdleState{SpawnID: srv.SpawnID}
	}
	eff, exempt := pol.Effective(srv.User, srv.Profile, serverGroups(srv))
	if !pol.Enabled || exempt || st.Verdict != VerdictIdle {
		return st, nil
	}
	rungs := ladder(eff)
	for i := st.Rung; i < len(rungs); i++ {
		if rungs[i].Action == ActionWarn && rungs[i].Next != "" {
			continue // report the action itself, not its warning
		}
		at := maxTime(st.Since, st.ExtendedUntil).Add(rungs[i].At)
		if !st.WarnedAt.IsZero() {
			at = maxTime(at, st.WarnedAt.Add(eff.Warn))
		}
		st.NextAction, st.NextAt = rungs[i].Action, at
		break
	}
	return st, nil
}

// extendScript grants an extension if the spawn's total stays within the
// limit.
//
// KEYS[1] the spawn's state. ARGV[1] now (Unix ms), ARGV[2] extension ms,
// ARGV[3] limit ms, ARGV[4] TTL ms.
// Returns {1, extended-until ms, total ms} when granted, {0, total ms}
// when the limit would be passed.
var extendScript = redis.NewScript(`
local total = tonumber(redis.call('HGET', KEYS[1], 'ext') or '0')
local d = tonumber(ARGV[2])
if total + d > tonumber(ARGV[3]) then
  return {0, total}
end
local now = tonumber(ARGV[1])
local untilMs = tonumber(redis.call('HGET', KEYS[1], 'extuntil') or '0')
if untilMs < now then untilMs = now end
untilMs = untilMs + d
redis.call('HSET', KEYS[1], 'ext', total + d, 'extuntil', untilMs)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, untilMs, total + d}
`)

// ErrExtendLimit is returned by Extend when the spawn's extensions would
// pass the policy's MaxExtend; it matches fleet.ErrInvalid.
var ErrExtendLimit = fmt.Errorf("%w: extension limit", fleet.ErrInvalid)

// Extend postpones idle actions on srv's current spawn by d (1 min..the
// remaining allowance of the policy's MaxExtend) on behalf of actor, writes
// an event and an audit record, and returns the new state. Errors:
// fleet.ErrConflict when srv is not running, fleet.ErrInvalid for a bad d,
// ErrExtendLimit (with the remaining allowance in the message) when the
// total would pass the limit.
func (r *Reclaimer) Extend(ctx context.Context, srv fleet.Server, d time.Duration, actor string) (IdleState, error) {
	if srv.State != v1.StateRunning {
		return IdleState{}, fmt.Errorf("%w: server %q is %s; only a running server can be extended", fleet.ErrConflict, srv.Name, srv.State)
	}
	if d < time.Minute {
		return IdleState{}, fmt.Errorf("%w: extend by at least one minute", fleet.ErrInvalid)
	}
	pol, err := r.policies.Get(ctx)
	if err != nil {
		return IdleState{}, err
	}
	eff, _ := pol.Effective(srv.User, srv.Profile, serverGroups(srv))
	now := r.now().UTC()
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	res, err := extendScript.Run(octx, r.rdb, []string{r.stateKey(srv.SpawnID)}, now.UnixMilli(), d.Milliseconds(), eff.MaxExtend.Milliseconds(), stateTTL.Milliseconds()).Int64Slice()
	cancel()
	if err != nil {
		return IdleState{}, fmt.Errorf("reclaim: extend %s/%s: %w", srv.User, srv.Name, err)
	}
	if len(res) < 2 {
		return IdleState{}, fmt.Errorf("reclaim: extend %s/%s: script returned %d values", srv.User, srv.Name, len(res))
	}
	if res[0] != 1 {
		left := eff.MaxExtend - time.Duration(res[1])*time.Millisecond
		return IdleState{}, fmt.Errorf("%w: this server can be extended by at most %s more (the limit is %s per start)", ErrExtendLimit, durationText(max(left, 0)), durationText(eff.MaxExtend))
	}
	if len(res) != 3 {
		return IdleState{}, fmt.Errorf("reclaim: extend %s/%s: script returned %d values, want 3", srv.User, srv.Name, len(res))
	}
	until := time.UnixMilli(res[1]).UTC()
	msg := fmt.Sprintf("extended by %s by %s; no idle action before %s", durationText(d), actor, clockText(until, now))
	if _, err := r.servers.Transition(ctx, srv.ServerKey, srv.SpawnID, v1.StateRunning, msg, fleet.ServerPatch{}); err != nil {
		return IdleState{}, fmt.Errorf("reclaim: extend %s/%s: %w", srv.User, srv.Name, err)
	}
	if err := r.policies.AppendAudit(ctx, AuditEntry{Time: now, Actor: actor, Action: AuditExtend, Target: target(srv), Reason: msg,
		PolicyVersion: pol.Version, Inputs: map[string]string{"spawnId": srv.SpawnID, "extendSeconds": strconv.FormatInt(int64(d/time.Second), 10),
			"extendedUntil": until.Format(time.RFC3339), "totalSeconds": strconv.FormatInt(res[2]/1000, 10)}}); err != nil {
		return IdleState{}, err
	}
	return r.State(ctx, srv)
}
