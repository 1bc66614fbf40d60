package reclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Servers is the server store the reclaimer reads and writes events
// through (implemented by redisstore.Store). Transition to the running
// state with a new message appends an event to the server's stream.
type Servers interface {
	ListServers(ctx context.Context, user string) ([]fleet.Server, error)
	Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch fleet.ServerPatch) (fleet.Server, error)
}

// Stopper stops a server without deleting its data, for by
// (servers.Service.Delete, which audits the stop).
type Stopper interface {
	Delete(ctx context.Context, by audit.Actor, key fleet.ServerKey) (fleet.Server, error)
}

// Shrinker sets a running server's compute share (guarantee and burst
// ceiling, percent of the GPU).
type Shrinker interface {
	SetCompute(ctx context.Context, srv fleet.Server, computePercent, computeLimitPercent int) error
}

// ActivityProber reads a notebook server's own activity (*Prober).
type ActivityProber interface {
	Probe(ctx context.Context, s fleet.Server) (Activity, error)
}

// ProxyActivity reads what the broker's notebook proxy saw of each spawn
// (redisstore.Notebooks): in order, the activity and whether there is any
// record; open WebSockets count only from records written within fresh.
type ProxyActivity interface {
	ProxyActivity(ctx context.Context, spawnIDs []string, now time.Time, fresh time.Duration) ([]fleet.ProxyActivity, []bool, error)
}

// HubNotifier tells JupyterHub that a server is in use (*Hub).
type HubNotifier interface {
	Activity(ctx context.Context, user, server string, at time.Time) error
}

// Samples reads the node agents' usage samples (implemented by
// redisstore.AgentSamples over limiter/agent/agentstore, the agent
// contract's one reader).
type Samples interface {
	// RecentSamples returns, for each spawn id (a slice id) in order, up to
	// n of its newest samples, newest first, ending with the first one
	// taken before since; none for a spawn without samples.
	RecentSamples(ctx context.Context, spawnIDs []string, n int, since time.Time) ([][]Sample, error)
}

// AuditLog receives the audit entry of every action (implemented by
// redisstore.AuditLog).
type AuditLog interface {
	AppendAudit(ctx context.Context, e audit.Entry) error
}

// Actor is the audit actor of the reclaimer's own actions.
const Actor = "reclaimer"

// ActorOf is Actor as an audit.Actor, for the lifecycle actions the
// reclaimer asks for (stop, shrink).
var ActorOf = audit.Actor{Name: Actor, Kind: v1.ActorReclaimer}

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
	// Policies is the policy; Audit the audit log; States the idle states;
	// Samples the node agents' samples.
	Policies *Policies
	Audit    AuditLog
	States   IdleStates
	Samples  Samples
	// Servers, Stopper, Shrinker and Prober are required.
	Servers  Servers
	Stopper  Stopper
	Shrinker Shrinker
	Prober   ActivityProber
	// Hub, when set, is told about servers whose GPU is busy.
	Hub HubNotifier
	// Proxy, when set, adds the notebook proxy's activity as a signal: a
	// request through it within the lookback makes an otherwise idle
	// server active. No record, or a failed read, changes nothing.
	Proxy ProxyActivity
	// ProxyFresh is how recent a proxy replica's record must be for its
	// open WebSockets to count (three of the proxy's flush intervals,
	// proxy.Config.ActivityFlush); 0 means 30 s.
	ProxyFresh time.Duration
	// Interval is the time between cycles; 0 means 30 s. Activity within
	// the last Interval (at least 1 min) counts as current.
	Interval time.Duration
	// SamplesPerServer is how many of a slice's newest samples a cycle
	// reads; 0 means 30.
	SamplesPerServer int
	// ProbeConcurrency bounds parallel notebook probes; 0 means 32.
	ProbeConcurrency int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives one line per cycle with errors; nil discards.
	Log *slog.Logger
	// Metrics receives each cycle's measurements; nil discards them.
	Metrics Metrics
}

// Reclaimer finds idle servers and warns, shrinks or stops them by the
// policy. One replica runs it (the composition root elects it with
// broker/internal/leader); State, Extend and Preview are safe from any
// replica. Safe for concurrent use.
type Reclaimer struct {
	policies *Policies
	audit    AuditLog
	states   IdleStates
	samples  Samples
	servers  Servers
	stopper  Stopper
	shrinker Shrinker
	prober   ActivityProber
	hub      HubNotifier
	proxy    ProxyActivity
	fresh    time.Duration
	interval time.Duration
	lookback time.Duration
	nSamples int
	probes   int
	now      func() time.Time
	log      *slog.Logger
	metrics  Metrics
}

// New checks cfg and returns a Reclaimer.
func New(cfg Config) (*Reclaimer, error) {
	if cfg.Policies == nil || cfg.Audit == nil || cfg.States == nil || cfg.Samples == nil ||
		cfg.Servers == nil || cfg.Stopper == nil || cfg.Shrinker == nil || cfg.Prober == nil {
		return nil, errors.New("reclaim: policies, audit, states, samples, servers, stopper, shrinker and prober are required")
	}
	r := &Reclaimer{policies: cfg.Policies, audit: cfg.Audit, states: cfg.States, samples: cfg.Samples,
		servers: cfg.Servers, stopper: cfg.Stopper, shrinker: cfg.Shrinker, prober: cfg.Prober, hub: cfg.Hub,
		proxy: cfg.Proxy, fresh: cfg.ProxyFresh, interval: cfg.Interval, nSamples: cfg.SamplesPerServer, probes: cfg.ProbeConcurrency, now: cfg.Now, log: cfg.Log,
		metrics: cfg.Metrics}
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
	if r.fresh <= 0 {
		r.fresh = 30 * time.Second
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.metrics == nil {
		r.metrics = noMetrics{}
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

// observed is what a cycle knows of the running servers before deciding:
// per server (same index) the observation, the previous idle state, the
// effective policy and whether the server is exempt.
type observed struct {
	run    []fleet.Server
	obs    []observation
	states []IdleState
	effs   []Policy
	exempt []bool
	// stopped are the stopped servers, for the freed-GPU measurement.
	stopped []fleet.Server
}

// observe reads every running server, its samples and idle state, and
// classifies it under pol at now, probing the notebooks whose GPU looks
// idle.
func (r *Reclaimer) observe(ctx context.Context, pol Policy, now time.Time) (observed, error) {
	var o observed
	all, err := r.servers.ListServers(ctx, "")
	if err != nil {
		return o, fmt.Errorf("reclaim: %w", err)
	}
	for _, s := range all {
		switch {
		case s.State == v1.StateRunning && s.SpawnID != "":
			o.run = append(o.run, s)
		case s.State == v1.StateStopped && s.SpawnID != "":
			o.stopped = append(o.stopped, s)
		}
	}
	ids := make([]string, len(o.run))
	for i, s := range o.run {
		ids[i] = s.SpawnID
	}
	samples, err := r.samples.RecentSamples(ctx, ids, r.nSamples, now.Add(-r.lookback))
	if err != nil {
		return o, fmt.Errorf("reclaim: read samples: %w", err)
	}
	if o.states, err = r.states.IdleStates(ctx, ids); err != nil {
		return o, fmt.Errorf("reclaim: %w", err)
	}
	if len(samples) != len(ids) || len(o.states) != len(ids) {
		return o, fmt.Errorf("reclaim: read %d sample windows and %d idle states for %d servers", len(samples), len(o.states), len(ids))
	}
	o.obs = make([]observation, len(o.run))
	o.effs = make([]Policy, len(o.run))
	o.exempt = make([]bool, len(o.run))
	var probe []int
	for i, s := range o.run {
		o.effs[i], o.exempt[i] = pol.Effective(s.User, s.Profile, serverGroups(s))
		in := map[string]string{}
		v, why := gpuEvidence(now, samples[i], o.effs[i].IdleComputePercent, r.lookback, in)
		o.obs[i] = observation{verdict: v, reason: why, inputs: in}
		if v == VerdictIdle {
			probe = append(probe, i)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.probes)
	for _, i := range probe {
		g.Go(func() error {
			a, perr := r.prober.Probe(gctx, o.run[i])
			o.obs[i].verdict, o.obs[i].reason = notebookEvidence(now, a, perr, r.lookback, o.obs[i].inputs)
			return nil
		})
	}
	_ = g.Wait() // the probes return no errors; failures are verdicts
	r.addProxyEvidence(ctx, now, &o, probe)
	return o, nil
}

// addProxyEvidence lets the notebook proxy's activity turn the probed
// servers that still look idle active (ARCHITECTURE.md invariant 4: a
// missing record or a failed read leaves every verdict as it was).
func (r *Reclaimer) addProxyEvidence(ctx context.Context, now time.Time, o *observed, probed []int) {
	var idle []int
	for _, i := range probed {
		if o.obs[i].verdict == VerdictIdle {
			idle = append(idle, i)
		}
	}
	if r.proxy == nil || len(idle) == 0 {
		return
	}
	ids := make([]string, len(idle))
	for j, i := range idle {
		ids[j] = o.run[i].SpawnID
	}
	acts, ok, err := r.proxy.ProxyActivity(ctx, ids, now, r.fresh)
	if err != nil || len(acts) != len(ids) || len(ok) != len(ids) {
		r.log.WarnContext(ctx, "reclaim: notebook proxy activity not read; deciding without it", "err", err)
		return
	}
	for j, i := range idle {
		o.obs[i].verdict, o.obs[i].reason = proxyEvidence(now, acts[j], ok[j], r.lookback, o.obs[i].inputs)
	}
}

// Cycle classifies every running server once and takes the actions due.
// Errors of single actions are joined into the returned error after the
// whole cycle ran; the report counts what was done.
//
// Every cycle reports to the configured Metrics: its duration and result,
// each server's verdict, each action, and the compute the reclaimer holds
// freed (servers it stopped that are still stopped, compute taken from
// shrunk ones), which counts as freed for one Interval per cycle.
func (r *Reclaimer) Cycle(ctx context.Context) (CycleReport, error) {
	start := time.Now() // a duration: the real clock, not the injected one
	rep, err := r.cycle(ctx)
	r.metrics.ObserveCycle(time.Since(start), err != nil)
	return rep, err
}

func (r *Reclaimer) cycle(ctx context.Context) (CycleReport, error) {
	var rep CycleReport
	now := r.now().UTC()
	pol, err := r.policies.Get(ctx)
	if err != nil {
		return rep, err
	}
	o, err := r.observe(ctx, pol, now)
	if err != nil {
		return rep, err
	}
	rep.Servers = len(o.run)
	var save []IdleState
	var errs []error
	var shrunkGPUs float64
	for i, s := range o.run {
		prev := o.states[i]
		next, acts := decide(now, s, pol, o.effs[i], o.exempt[i], o.obs[i], prev)
		switch next.Verdict {
		case VerdictActive:
			rep.Active++
		case VerdictIdle:
			rep.Idle++
		default:
			rep.Unknown++
		}
		r.metrics.ObserveDecision(string(next.Verdict), ReasonClass(next.Verdict, next.Reason))
		failed := false
		compute := s.Slice.ComputePercent // the server's compute after the actions
		for _, a := range acts {
			applied, err := r.do(ctx, now, s, pol, a, o.obs[i].inputs)
			if applied && a.compute > 0 {
				compute = a.compute
			}
			if applied && a.stop {
				next.StoppedAt = now
			}
			if err != nil {
				if !errors.Is(err, errExtendedMeanwhile) {
					errs = append(errs, err)
				}
				// A change that took effect before a later step failed
				// (its event, its audit) keeps the ladder's record of it:
				// a shrink forgotten would never be restored.
				failed = !applied
				break
			}
			if a.audit != "" {
				rep.Actions++
				r.metrics.ObserveAction(actionName(a.audit), a.why, pol.DryRun)
			}
		}
		if failed {
			// Keep the ladder where it was; the next cycle tries again.
			next.Rung, next.WarnedAt, next.AgeWarnedAt, next.ShrunkFrom, next.ShrunkLimitFrom =
				prev.Rung, prev.WarnedAt, prev.AgeWarnedAt, prev.ShrunkFrom, prev.ShrunkLimitFrom
		}
		if next.ShrunkFrom > compute {
			shrunkGPUs += float64(next.ShrunkFrom-compute) / 100
		}
		// A spawn seen for the first time has no CheckedAt: it is saved.
		if changed(prev, next) || now.Sub(prev.CheckedAt) > 24*time.Hour {
			next.CheckedAt = now
			save = append(save, next)
		}
		if r.hub != nil && next.Verdict == VerdictActive && (next.Reason == reasonGPUBusy || next.Reason == reasonKernelLaunch) {
			if err := r.hub.Activity(ctx, s.User, s.Name, now); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(save) > 0 {
		if err := r.states.SaveIdleStates(ctx, save); err != nil {
			errs = append(errs, fmt.Errorf("reclaim: %w", err))
		}
	}
	ids := make([]string, len(o.stopped))
	for i, s := range o.stopped {
		ids[i] = s.SpawnID
	}
	if stopped, err := r.states.IdleStates(ctx, ids); err != nil {
		errs = append(errs, fmt.Errorf("reclaim: idle states of stopped servers: %w", err))
	} else {
		r.metrics.ObserveFreed(freedByStops(o.stopped, stopped), shrunkGPUs, r.interval)
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

// errExtendedMeanwhile is do's answer for an idle action on a spawn whose
// user extended its idle clock while the cycle ran: nothing was done.
var errExtendedMeanwhile = errors.New("reclaim: extended while the cycle ran")

// do carries out a (unless the policy is a dry run) and audits it. applied
// reports whether a's change of the server (a stop, a compute change) took
// effect, also when a later step (its event, its audit) failed. An idle
// stop or shrink first reads the spawn's idle state again: an extension
// granted since the cycle read it (its probes take seconds) makes do
// answer errExtendedMeanwhile, doing nothing; a state that cannot be read
// stops the action too (never act on missing data).
func (r *Reclaimer) do(ctx context.Context, now time.Time, s fleet.Server, pol Policy, a act, inputs map[string]string) (applied bool, err error) {
	if !pol.DryRun {
		if (a.stop || a.compute > 0) && a.why == whyIdle {
			st, err := r.state(ctx, s)
			if err != nil {
				return false, fmt.Errorf("reclaim %s/%s: %s: %w", s.User, s.Name, a.audit, err)
			}
			if now.Before(st.ExtendedUntil) {
				return false, errExtendedMeanwhile
			}
		}
		switch {
		case a.stop:
			if _, err = r.servers.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateRunning, a.message, fleet.ServerPatch{}); err == nil {
				_, err = r.stopper.Delete(ctx, ActorOf, s.ServerKey)
				applied = err == nil
			}
		case a.compute > 0:
			if err = r.shrinker.SetCompute(ctx, s, a.compute, a.limit); err == nil {
				applied = true
				_, err = r.servers.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateRunning, a.message, fleet.ServerPatch{})
			}
		default:
			_, err = r.servers.Transition(ctx, s.ServerKey, s.SpawnID, v1.StateRunning, a.message, fleet.ServerPatch{})
		}
		if err != nil {
			return applied, fmt.Errorf("reclaim %s/%s: %s: %w", s.User, s.Name, a.audit, err)
		}
	}
	if a.audit == "" {
		return applied, nil
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
	return applied, r.audit.AppendAudit(ctx, audit.Entry{Time: now, Source: v1.AuditSourceReclaim, Actor: Actor, ActorKind: v1.ActorReclaimer, Action: a.audit, Target: target(s),
		Reason: a.message, PolicyVersion: pol.Version, Inputs: in})
}

// state reads srv's current spawn's idle state.
func (r *Reclaimer) state(ctx context.Context, srv fleet.Server) (IdleState, error) {
	sts, err := r.states.IdleStates(ctx, []string{srv.SpawnID})
	if err != nil {
		return IdleState{}, fmt.Errorf("reclaim: idle state of %s/%s: %w", srv.User, srv.Name, err)
	}
	if len(sts) != 1 {
		return IdleState{}, fmt.Errorf("reclaim: idle state of %s/%s: %d states read, want 1", srv.User, srv.Name, len(sts))
	}
	return sts[0], nil
}

// State returns the idle state of srv's current spawn with its next step
// (NextAction, NextAt) under the current policy. A spawn the reclaimer
// has not seen yet has an empty Verdict.
func (r *Reclaimer) State(ctx context.Context, srv fleet.Server) (IdleState, error) {
	pol, err := r.policies.Get(ctx)
	if err != nil {
		return IdleState{}, err
	}
	st, err := r.state(ctx, srv)
	if err != nil {
		return IdleState{}, err
	}
	eff, exempt := pol.Effective(srv.User, srv.Profile, serverGroups(srv))
	st.NextAction, st.NextAt = nextStep(st, pol, eff, exempt)
	return st, nil
}

// ErrExtendLimit is returned by Extend when the spawn's extensions would
// pass the policy's MaxExtend; it matches fleet.ErrInvalid.
var ErrExtendLimit = fmt.Errorf("%w: extension limit", fleet.ErrInvalid)

// Extend postpones idle actions on srv's current spawn by d (1 min..the
// remaining allowance of the policy's MaxExtend) for actor (the user, the
// hub acting for them, or an admin), writes
// an event and an audit record, and returns the new state. Errors:
// fleet.ErrConflict when srv is not running, fleet.ErrInvalid for a bad d,
// ErrExtendLimit (with the remaining allowance in the message) when the
// total would pass the limit.
func (r *Reclaimer) Extend(ctx context.Context, srv fleet.Server, d time.Duration, actor audit.Actor) (IdleState, error) {
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
	ext, err := r.states.ExtendIdle(ctx, srv.SpawnID, now, d, eff.MaxExtend)
	if err != nil {
		return IdleState{}, fmt.Errorf("reclaim: extend %s/%s: %w", srv.User, srv.Name, err)
	}
	if !ext.Granted {
		left := eff.MaxExtend - ext.Total
		return IdleState{}, fmt.Errorf("%w: this server can be extended by at most %s more (the limit is %s per start)", ErrExtendLimit, durationText(max(left, 0)), durationText(eff.MaxExtend))
	}
	msg := fmt.Sprintf("extended by %s by %s; no idle action before %s", durationText(d), actor.Name, clockText(ext.Until, now))
	if _, err := r.servers.Transition(ctx, srv.ServerKey, srv.SpawnID, v1.StateRunning, msg, fleet.ServerPatch{}); err != nil {
		return IdleState{}, fmt.Errorf("reclaim: extend %s/%s: %w", srv.User, srv.Name, err)
	}
	if err := r.audit.AppendAudit(ctx, audit.Entry{Time: now, Source: v1.AuditSourceReclaim, Actor: actor.Name, ActorKind: actor.Kind,
		Action: AuditExtend, Target: target(srv), Reason: msg,
		PolicyVersion: pol.Version, Inputs: map[string]string{"spawnId": srv.SpawnID, "extendSeconds": strconv.FormatInt(int64(d/time.Second), 10),
			"extendedUntil": ext.Until.Format(time.RFC3339), "totalSeconds": strconv.FormatInt(int64(ext.Total/time.Second), 10)}}); err != nil {
		return IdleState{}, err
	}
	return r.State(ctx, srv)
}
