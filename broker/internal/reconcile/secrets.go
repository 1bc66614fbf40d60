package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

// collectSecrets deletes the Secrets that no current spawn holds (no pod of
// their spawn in podBySpawn, no unfinished record in recBySpawn), counting
// them in rep.DeletedSecrets: Secrets of servers that stopped or failed
// while their deletion did not get through, or whose records Redis lost.
// One is deleted only once passes have seen that same version of it
// (uid/resourceVersion) unheld for the grace period: a Secret just written
// may belong to a spawn whose record or pod this pass has not seen yet. A
// caller lists secrets; when that fails it does not call, which keeps what
// earlier passes saw. Called with r.mu held.
func (r *Reconciler) collectSecrets(ctx context.Context, now time.Time, secrets []spawner.ManagedSecret, podBySpawn map[string]spawner.ManagedPod, recBySpawn map[string]fleet.Server, rep *Report) error {
	var errs []error
	unheld := make(map[string]time.Time)
	for _, sec := range secrets {
		if _, ok := podBySpawn[sec.SpawnID]; ok {
			continue
		}
		if rec, ok := recBySpawn[sec.SpawnID]; ok && !fleet.Terminal(rec.State) {
			continue
		}
		version := sec.UID + "/" + sec.ResourceVersion
		since, seen := r.unheldSecrets[version]
		if !seen {
			since = now
		}
		if now.Sub(since) <= r.grace {
			unheld[version] = since
			continue
		}
		if err := r.pods.DeleteSecret(ctx, sec); err != nil {
			unheld[version] = since
			errs = append(errs, fmt.Errorf("delete orphan secret %s: %w", sec.Name, err))
			continue
		}
		rep.DeletedSecrets++
	}
	r.unheldSecrets = unheld
	return errors.Join(errs...)
}
