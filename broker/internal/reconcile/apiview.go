package reconcile

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpubroker/gpubroker/spawner"
)

// apiView is the API server's own list of pods, read at most once per pass
// and only when the pass needs it: before it acts on a pod's absence from
// the cache (which lags the API server while a broken watch backs off) and
// before it reopens placement.
type apiView struct {
	pods    Pods
	listed  bool
	bySpawn map[string]spawner.ManagedPod
	err     error
}

func (v *apiView) list(ctx context.Context) error {
	if !v.listed {
		v.listed = true
		pods, err := v.pods.ListPods(ctx)
		if err != nil {
			v.err = fmt.Errorf("reconcile: list pods from the API server: %w", err)
			return v.err
		}
		v.bySpawn = make(map[string]spawner.ManagedPod, len(pods))
		for _, p := range pods {
			// Every pod that names its spawn (a readable one always does)
			// proves that its spawn's pod is there (absent), even when its
			// other annotations cannot be read, though not its slice
			// (unheld).
			if p.SpawnID != "" {
				v.bySpawn[p.SpawnID] = p
			}
		}
	}
	return v.err
}

// absent reports whether the API server has no pod of spawnID, counting a
// pod whose other annotations cannot be read (a record must not be settled
// as ended, and its slice freed, while such a pod runs); a failed list is
// not proof (false, and the error once).
func (v *apiView) absent(ctx context.Context, spawnID string) (bool, error) {
	if v.listed && v.err != nil {
		return false, nil
	}
	if err := v.list(ctx); err != nil {
		return false, err
	}
	_, ok := v.bySpawn[spawnID]
	return !ok, nil
}

// unheld returns the names of the API server's readable pods that are not
// being deleted and whose slices are not in held, sorted.
func (v *apiView) unheld(ctx context.Context, held map[string]bool) ([]string, error) {
	if err := v.list(ctx); err != nil {
		return nil, err
	}
	var out []string
	for id, p := range v.bySpawn {
		if p.Err == nil && !p.Deleting && !held[id] {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}
