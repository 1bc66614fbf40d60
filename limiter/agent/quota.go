package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// QuotaStore is where desired quotas come from and applied ones go.
type QuotaStore interface {
	DesiredQuota(ctx context.Context, slice string) (agentstore.DesiredQuota, error)
	SetAppliedQuota(ctx context.Context, slice string, a agentstore.AppliedQuota) error
	WatchQuotaChanges(ctx context.Context, fn func(slice string)) error
}

// prepareSlice lays out slice s's host directory (PrepareSlice) and
// remembers the memory limit of a quota file it wrote.
func (a *Agent) prepareSlice(s SliceInfo) error {
	q, wrote, err := PrepareSlice(a.cfg.HostRoot, s)
	if wrote {
		a.quotaMu.Lock()
		a.limits[s.ID] = limitsOfQuota(q)
		a.computes[s.ID] = s.Initial.ComputePercent
		a.quotaMu.Unlock()
	}
	return err
}

// PrepareSlice lays out slice s's host directory under hostRoot the way the
// pod contract needs it (ARCHITECTURE.md "Pod contract", "Quota region",
// "Usage region"): <hostRoot>/slices/<id>/quota and .../usage at mode 0755,
// the usage file created initialized at mode 0666 (only root can replace
// it), and, if the quota path holds no valid quota file, the pod's initial
// slice written as the first one (generation 1 or the next); it returns that
// quota and wrote true then. The agent does this as soon as it sees the pod,
// so the hook, which reads nothing else, normally finds its quota before its
// first driver call (it waits up to 5 s for it); the pod runner's limiter
// (limiter/hook/podhook) does the same before it starts a process. Nothing
// at these paths is followed or blocks: what is not a regular file of the
// right size is reported, not used; a quota path is replaced by rename. A
// bad usage path is returned as an error after the quota was taken care of.
func PrepareSlice(hostRoot string, s SliceInfo) (q region.Quota, wrote bool, err error) {
	dir := filepath.Join(hostRoot, v1.HostSlicesSubdir, s.ID)
	for _, sub := range []string{"quota", "usage"} {
		d := filepath.Join(dir, sub)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return q, false, fmt.Errorf("slice %s: %w", s.ID, err)
		}
		// Lchown/Chmod the directory itself (not what a link would point at): 0755, root's.
		st, err := os.Lstat(d)
		if err != nil {
			return q, false, fmt.Errorf("slice %s: %w", s.ID, err)
		}
		if !st.IsDir() {
			return q, false, fmt.Errorf("slice %s: %s is %s, not a directory", s.ID, d, st.Mode().Type())
		}
		if st.Mode().Perm() != 0o755 {
			if err := os.Chmod(d, 0o755); err != nil {
				return q, false, fmt.Errorf("slice %s: %w", s.ID, err)
			}
		}
	}
	// A bad usage path (root in the container can plant anything there) is
	// reported but stops nothing else: the quota must still be applied.
	usageErr := region.CreateUsage(filepath.Join(dir, "usage", v1.UsageFileName))
	if usageErr != nil {
		usageErr = fmt.Errorf("slice %s: %w", s.ID, usageErr)
	}
	path := filepath.Join(dir, "quota", v1.QuotaFileName)
	if _, err := region.ReadQuota(path); err == nil {
		return q, false, usageErr
	}
	q = s.quota(s.Initial)
	if err := region.WriteQuota(path, q); err != nil {
		return q, false, errors.Join(usageErr, fmt.Errorf("slice %s: initial quota: %w", s.ID, err))
	}
	return q, true, usageErr
}

// applyQuota prepares slice s (prepareSlice) and brings its quota file to
// its desired quota, if the broker set one, and records the applied
// generation. It is level-based and idempotent: a file that already holds
// the desired values is not rewritten (the hook sees no new generation), but
// the applied generation is still recorded once. Without a desired quota the
// initial quota from the pod's annotations stays in force.
func (a *Agent) applyQuota(ctx context.Context, s SliceInfo) error {
	// The resync loop and the notification handler both apply quotas;
	// region.WriteQuota must not run twice at once on one file, and the
	// applied generation must match the file's content, so applications
	// are serialized.
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	prepErr := a.prepareSlice(s)
	if err := a.applyDesired(ctx, s); err != nil {
		return errors.Join(prepErr, err)
	}
	return prepErr
}

// applyDesired writes slice s's desired quota, if any (applyMu held).
func (a *Agent) applyDesired(ctx context.Context, s SliceInfo) error {
	d, err := a.quotas.DesiredQuota(ctx, s.ID)
	if errors.Is(err, agentstore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("slice %s: %w", s.ID, err)
	}
	a.quotaMu.Lock()
	done := a.applied[s.ID] >= d.Generation && d.Generation > 0
	a.quotaMu.Unlock()
	path := a.slicePath(s.ID, "quota", v1.QuotaFileName)
	want := s.quota(d.Slice)
	if err := want.Validate(); err != nil {
		return fmt.Errorf("slice %s: desired quota generation %d: %w", s.ID, d.Generation, err)
	}
	cur, err := region.ReadQuota(path)
	same := err == nil && cur.SliceID == want.SliceID && cur.MemoryLimitBytes == want.MemoryLimitBytes &&
		cur.ComputePercent == want.ComputePercent && cur.ComputeLimitPercent == want.ComputeLimitPercent &&
		cur.GPUUUID == want.GPUUUID
	if same && done {
		return nil
	}
	fileGen := cur.Generation
	if !same {
		if err := region.WriteQuota(path, want); err != nil {
			return fmt.Errorf("slice %s: %w", s.ID, err)
		}
		q, err := region.ReadQuota(path)
		if err != nil {
			return fmt.Errorf("slice %s: reread quota: %w", s.ID, err)
		}
		fileGen = q.Generation
		a.quotaMu.Lock()
		a.limits[s.ID] = limitsOfQuota(q)
		a.computes[s.ID] = d.ComputePercent
		a.quotaMu.Unlock()
		a.log.InfoContext(ctx, "quota applied", "slice_id", s.ID, "generation", d.Generation,
			"file_generation", fileGen, "mem_mib", d.MemoryMiB, "sm_percent", d.ComputePercent)
	}
	err = a.quotas.SetAppliedQuota(ctx, s.ID, agentstore.AppliedQuota{
		Generation: d.Generation, FileGeneration: fileGen, Node: a.cfg.Node, At: a.clock.Now(),
	})
	if err != nil {
		return fmt.Errorf("slice %s: %w", s.ID, err)
	}
	a.quotaMu.Lock()
	a.applied[s.ID] = d.Generation
	a.quotaMu.Unlock()
	return nil
}

// applyQuotas applies every local slice's desired quota; errors are joined.
// It also forgets slices that left the node.
func (a *Agent) applyQuotas(ctx context.Context) error {
	var errs []error
	local := a.pods.Slices()
	ids := make(map[string]bool, len(local))
	for _, s := range local {
		ids[s.ID] = true
		if err := a.applyQuota(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	a.quotaMu.Lock()
	for id := range a.applied {
		if !ids[id] {
			delete(a.applied, id)
		}
	}
	// An applyQuota of a pod list older than the sampling round that
	// forgot a gone slice may have written its caps back.
	for id := range a.limits {
		if !ids[id] {
			delete(a.limits, id)
			delete(a.computes, id)
		}
	}
	a.quotaMu.Unlock()
	return errors.Join(errs...)
}

// applyQuotaByID applies the quota of one slice if it is on this node.
func (a *Agent) applyQuotaByID(ctx context.Context, id string) error {
	for _, s := range a.pods.Slices() {
		if s.ID == id {
			return a.applyQuota(ctx, s)
		}
	}
	return nil
}

// quotaLoop prepares every local slice and applies its desired quota at
// once, whenever a slice appears, and every QuotaResync, until ctx ends.
func (a *Agent) quotaLoop(ctx context.Context) error {
	t := a.clock.NewTicker(a.cfg.QuotaResync)
	defer t.Stop()
	for {
		if err := a.applyQuotas(ctx); err != nil && ctx.Err() == nil {
			a.metrics.errors.WithLabelValues("quota").Inc()
			a.log.WarnContext(ctx, "quota resync incomplete", "err", err)
		}
		a.kickMPS() // a new MPS slice sets its GPU's client size
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		case <-a.pods.Changed():
		}
	}
}

// watchLoop applies a slice's desired quota as soon as the broker
// announces a change, resubscribing after failures, until ctx ends.
func (a *Agent) watchLoop(ctx context.Context) error {
	for {
		err := a.quotas.WatchQuotaChanges(ctx, func(id string) {
			if err := a.applyQuotaByID(ctx, id); err != nil {
				a.metrics.errors.WithLabelValues("quota").Inc()
				a.log.WarnContext(ctx, "quota not applied", "slice_id", id, "err", err)
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		a.metrics.errors.WithLabelValues("redis").Inc()
		a.log.WarnContext(ctx, "quota watch failed; resubscribing", "err", err)
		t := a.clock.NewTicker(retryWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
			t.Stop()
		}
	}
}
