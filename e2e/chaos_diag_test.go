package e2e

import (
	"context"
	le "encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// faultEvent is one step of a fault as the soak's driver saw it, for the
// checker's diagnoses: a kill, a restart, a flush, a node coming back.
type faultEvent struct {
	at   time.Time
	what string
}

// diagWindow is how far back a diagnosis lists the faults before a finding.
const diagWindow = 30 * time.Second

// event records one step of a fault with the time it happened.
func (ch *chaos) event(format string, args ...any) {
	ch.mu.Lock()
	ch.events = append(ch.events, faultEvent{at: time.Now(), what: fmt.Sprintf(format, args...)})
	ch.mu.Unlock()
}

// diagnose logs, for a finding of the storm's checker on gpu (or for user,
// when gpu is ""), the fault steps of the last diagWindow and every pod
// and Redis allocation involved, with creation times: the sequence that led
// to it. Each distinct set of pods and allocations is logged once.
func (ch *chaos) diagnose(ctx context.Context, finding, gpu, user string, pods []corev1.Pod) {
	w := ch.w
	now := time.Now()
	var b strings.Builder
	fmt.Fprintf(&b, "chaos diagnosis at %s: %s\n", now.Format("15:04:05.000"), finding)
	var sig []string
	for _, p := range pods {
		a := p.Annotations
		if (gpu != "" && a[v1.AnnotationGPUUUID] != gpu) || (user != "" && a[v1.AnnotationUser] != user) {
			continue
		}
		sig = append(sig, a[v1.AnnotationSpawnID])
		del := ""
		if p.DeletionTimestamp != nil {
			del = " deleting since " + p.DeletionTimestamp.Format("15:04:05")
		}
		fmt.Fprintf(&b, "  pod %s spawn %s user %s gpu %s %s MiB %s%% phase %s created %s (%s ago)%s\n", p.Name, a[v1.AnnotationSpawnID],
			a[v1.AnnotationUser], a[v1.AnnotationGPUUUID], a[v1.AnnotationMemoryMiB], a[v1.AnnotationComputePercent], p.Status.Phase,
			p.CreationTimestamp.Format("15:04:05"), now.Sub(p.CreationTimestamp.Time).Round(time.Second), del)
	}
	rdb := w.redis.Client(w.t)
	allocs, err := rdb.HGetAll(ctx, redisschemaPrefix+"{gpubroker}:allocs").Result()
	if err != nil {
		fmt.Fprintf(&b, "  redis allocations: %v\n", err)
	}
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range allocs {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range ids {
		var a struct {
			User           string `json:"user"`
			GPU            string `json:"gpu"`
			MemoryMiB      int64  `json:"memoryMiB"`
			ComputePercent int    `json:"computePercent"`
		}
		_ = json.Unmarshal([]byte(allocs[id]), &a)
		if (gpu != "" && a.GPU != gpu) || (user != "" && a.User != user) {
			continue
		}
		sig = append(sig, "r"+id)
		fmt.Fprintf(&b, "  redis allocation %s user %s gpu %s %d MiB %d%%\n", id, a.User, a.GPU, a.MemoryMiB, a.ComputePercent)
	}
	if gpu != "" {
		h, _ := rdb.HGetAll(ctx, redisschemaPrefix+"{gpubroker}:gpu:"+gpu).Result()
		if use := []byte(h["use"]); len(use) == 16 { // allocations int32, MiB int64, compute % int32, little-endian
			fmt.Fprintf(&b, "  redis gpu %s: amem %d acp %d n %d\n", gpu, int64(le.LittleEndian.Uint64(use[4:12])),
				int32(le.LittleEndian.Uint32(use[12:16])), int32(le.LittleEndian.Uint32(use[0:4])))
		} else {
			fmt.Fprintf(&b, "  redis gpu %s: use %q amem %s acp %s n %s\n", gpu, h["use"], h["amem"], h["acp"], h["n"])
		}
	}
	marker, _ := rdb.Get(ctx, redisschemaPrefix+"{gpubroker}:marker").Result()
	epoch, _ := rdb.Get(ctx, redisschemaPrefix+"{gpubroker}:marker:epoch").Result()
	fmt.Fprintf(&b, "  marker %q epoch %q\n", marker, epoch)
	sort.Strings(sig)
	key := finding[:strings.Index(finding+":", ":")] + " " + gpu + user + " " + strings.Join(sig, ",")
	ch.mu.Lock()
	seen := ch.diagnosed[key]
	ch.diagnosed[key] = true
	var recent []faultEvent
	for _, e := range ch.events {
		if now.Sub(e.at) <= diagWindow {
			recent = append(recent, e)
		}
	}
	ch.mu.Unlock()
	if seen {
		return
	}
	for _, e := range recent {
		fmt.Fprintf(&b, "  fault %s (%s before): %s\n", e.at.Format("15:04:05.000"), now.Sub(e.at).Round(100*time.Millisecond), e.what)
	}
	w.t.Log(b.String())
}
