package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

var (
	chaosDuration = flag.Duration("chaos.duration", time.Minute, "how long TestChaos injects faults (`go tool task chaos` passes 10m)")
	chaosEvery    = flag.Duration("chaos.fault-every", 3*time.Second, "mean time between two faults TestChaos injects")
	chaosClients  = flag.Int("chaos.clients", 50, "concurrent API clients in TestChaos, one user each")
)

// The fault kinds TestChaos injects, each about equally often.
const (
	faultKillBroker   = "kill-broker"
	faultRedisRestart = "redis-restart"
	faultRedisFlush   = "redis-flushall"
	faultAPIRestart   = "apiserver-restart"
	faultPodDelete    = "pod-delete"
	faultPodEvict     = "pod-evict"
	faultNodeDelete   = "node-delete"
	faultKillSpawn    = "kill-mid-spawn"
)

var chaosFaults = []string{faultKillBroker, faultRedisRestart, faultRedisFlush, faultAPIRestart,
	faultPodDelete, faultPodEvict, faultNodeDelete, faultKillSpawn}

// errNoTarget is a fault that found nothing to hit (all but one replica
// or node already down); it is not counted.
var errNoTarget = errors.New("no target")

// chaosQuota is the servers quota of every chaos user (testProfiles).
const chaosQuota = 2

// TestChaos is the chaos soak: for -chaos.duration (default 1 minute, about
// 15 faults) -chaos.clients users create, resize, extend and delete servers
// at random through two broker replicas (under the Lease: periodic
// reconcile passes and reclaim on its holder only), while a driver injects every
// fault kind in chaosFaults at random times, and a checker watches, every
// second, that no GPU is overcommitted (from the pods' annotations and
// from the brokers' view of Redis) and no user holds more pods than the
// quota. After the storm, with every replica up, it waits for the system
// to settle and checks: allocations equal the pods' annotations (no leaked
// slice), every pod and Secret belongs to a current server (no orphan), no
// server is left in a transitional state, and every server whose create
// was answered 2xx exists unless its owner deleted it (2xx). It runs on a
// cluster of its own, since it restarts the API server.
func TestChaos(t *testing.T) {
	t.Parallel()
	needCluster(t) // for -short and missing tools; the cluster itself is ours
	ctx := t.Context()
	w := newChaosWorld(t, 4, 4, 2)
	ch := &chaos{w: w, rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 16)), faults: map[string]int{}, answers: map[string]int{}, lostWithRedis: map[string]bool{}, diagnosed: map[string]bool{}}

	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { w.agents(ctx, stop) })
	bg.Go(func() { ch.check(ctx, stop) })
	var clients sync.WaitGroup
	for i := range *chaosClients {
		u := &chaosUser{name: fmt.Sprintf("user%02d", i), servers: map[string]*tracked{}}
		ch.users = append(ch.users, u)
		clients.Go(func() { ch.client(ctx, stop, u, uint64(i)) })
	}

	end := time.Now().Add(*chaosDuration)
	for i := 0; time.Now().Before(end); i++ {
		pause := time.Duration(float64(*chaosEvery) * (0.5 + ch.rand().Float64()))
		select {
		case <-ctx.Done():
			t.Fatalf("chaos: %v", ctx.Err())
		case <-time.After(pause):
		}
		kind := chaosFaults[i%len(chaosFaults)]
		if i%len(chaosFaults) == 0 {
			ch.shuffleFaults()
		}
		if err := ch.inject(ctx, kind); err != nil {
			t.Errorf("inject %s: %v", kind, err)
		}
	}
	close(stop)
	clients.Wait()
	ch.restarts.Wait()
	bg.Wait()
	for _, b := range w.brokers {
		if err := b.Start(ctx); err != nil {
			t.Fatalf("start replica after the storm: %v", err)
		}
	}
	w.registerAll(ctx)
	problems := ch.settle(ctx)
	ch.report(t, problems)
	if len(problems) == 0 {
		ch.selfTest(ctx, t)
	}
}

// selfTest shows that the checker can fail: on the settled cluster it plants
// a copy of a running pod claiming a whole GPU under a spawn nobody holds, a
// Secret of no server and a 2xx-created server that never existed, and
// checks that checkOnce and endProblems name each; then it removes them.
func (ch *chaos) selfTest(ctx context.Context, t *testing.T) {
	w := ch.w
	u := ch.users[0]
	f := ch.flushes.Load()
	u.note("selftest-never-created", func(tr *tracked) { tr.created, tr.createdFlush = true, f })
	defer func() {
		u.mu.Lock()
		delete(u.servers, "selftest-never-created")
		u.mu.Unlock()
	}()
	// The slow part (a GET per server) first, so that the planted objects
	// are checked before the reconciler's grace period removes them.
	servers, got, err := ch.endServers(ctx)
	if err != nil {
		t.Fatalf("self-test: %v", err)
	}
	pods, err := w.pods(ctx)
	if err != nil {
		t.Fatalf("self-test: %v", err)
	}
	want := [][]string{{"lost: " + u.name + "/selftest-never-created"}}
	podAPI, secretAPI := w.cluster.Client.CoreV1().Pods(w.ns), w.cluster.Client.CoreV1().Secrets(w.ns)
	if i := slices.IndexFunc(pods, func(p corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }); i >= 0 {
		bad := pods[i].DeepCopy()
		bad.ObjectMeta = metav1.ObjectMeta{Name: "selftest-overcommit", Labels: bad.Labels, Annotations: bad.Annotations}
		bad.Annotations[v1.AnnotationSpawnID] = "selftest"
		bad.Annotations[v1.AnnotationMemoryMiB] = fmt.Sprint(gpuMemoryMiB)
		bad.Status = corev1.PodStatus{}
		if _, err := podAPI.Create(ctx, bad, metav1.CreateOptions{}); err != nil {
			t.Fatalf("self-test: plant a pod: %v", err)
		}
		t.Cleanup(func() { _ = podAPI.Delete(context.Background(), bad.Name, metav1.DeleteOptions{}) })
		want = append(want, []string{"pods overcommit"}, []string{"orphan pod selftest-overcommit", "terminating pod selftest-overcommit"},
			[]string{"leaked slices"})
	} else {
		t.Logf("chaos self-test: no running pod to copy; the overcommit case is not planted")
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "selftest-orphan-env",
		Labels:      map[string]string{v1.LabelManagedBy: v1.ManagedByValue},
		Annotations: map[string]string{v1.AnnotationSpawnID: "selftest", v1.AnnotationUser: "nobody", v1.AnnotationServer: "nb"}}}
	if _, err := secretAPI.Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatalf("self-test: plant a secret: %v", err)
	}
	t.Cleanup(func() { _ = secretAPI.Delete(context.Background(), sec.Name, metav1.DeleteOptions{}) })
	want = append(want, []string{"orphan secret selftest-orphan-env"})

	got = append(got, ch.checkOnce(ctx)...)
	end, err := ch.endCluster(ctx, servers)
	if err != nil {
		t.Fatalf("self-test: %v", err)
	}
	got = append(got, end...)
	for _, alts := range want {
		if !slices.ContainsFunc(got, func(p string) bool {
			return slices.ContainsFunc(alts, func(w string) bool { return strings.HasPrefix(p, w) })
		}) {
			t.Errorf("chaos self-test: the checker missed a planted %q; it reported %q", alts[0], got)
		}
	}
	t.Logf("chaos self-test: the checker caught every planted fault (%d)", len(want))
}

// chaosWorld is TestChaos's cluster, Redis, issuer and broker replicas.
type chaosWorld struct {
	*env
	brokers []*harness.Broker
	mu      sync.Mutex // guards nodesDown
	// nodesDown are nodes deleted by a fault and not yet back.
	nodesDown map[string]bool
}

// newChaosWorld starts a cluster of its own (etcd, kube-apiserver, kwok),
// nodes × gpus GPUs, one redis-server and replicas brokers on it.
func newChaosWorld(t *testing.T, nodes, gpus, replicas int) *chaosWorld {
	t.Helper()
	ctx := t.Context()
	c, err := harness.StartCluster(ctx, suite.tools, t.TempDir())
	if err != nil {
		t.Fatalf("start the chaos cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos cluster logs:\n%s", c.LogTails(30))
			for _, name := range []string{"kwok.log", "kube-apiserver.log"} {
				keepLog(t, filepath.Join(c.Dir, name))
			}
		}
		if err := c.Stop(); err != nil {
			t.Logf("stop the chaos cluster: %v", err)
		}
	})
	w := &chaosWorld{env: &env{t: t, cluster: c}, nodesDown: map[string]bool{}}
	e := w.env
	e.ns = newNamespace(t, c)
	e.allowLeases() // the replicas run under the Lease, as the chart runs them
	e.nodes = newNodes(t, c, nodes)
	for ni, node := range e.nodes {
		for gi := range gpus {
			e.gpus = append(e.gpus, v1.GPU{UUID: fmt.Sprintf("GPU-chaos-%d-%d", ni, gi), Node: node, Model: gpuModel,
				MemoryMiB: gpuMemoryMiB, SMCount: gpuSMs, Healthy: true})
		}
	}
	e.redis = redistest.Start(t)
	e.issuer = devissuer.StartTest(t)
	bin := plainBrokerBinary(t) // load, not races: -race brokers would not keep up on 2 cores
	for range replicas {
		b, err := harness.StartBroker(ctx, harness.BrokerOptions{
			Binary: bin, Dir: t.TempDir(), RedisURL: e.redis.URL(), Kubeconfig: c.BrokerKubeconfig,
			Namespace: e.ns, IssuerURL: e.issuer.URL(), Audience: audience, ProfilesYAML: testProfiles,
			ReconcileInterval: time.Second, OrphanGrace: 2 * time.Second,
			// Periodic reconcile passes and reclaim run on the Lease holder
			// only, so a SIGKILL of the holder leaves passes to whoever
			// takes the Lease over, within the lease duration.
			Args: []string{"--leader-election-namespace=" + e.ns, "--lease-duration=" + haLeaseDuration.String()},
		})
		if err != nil {
			t.Fatalf("start replica: %v", err)
		}
		t.Cleanup(func() {
			if err := b.Stop(); err != nil {
				t.Logf("stop replica: %v", err)
			}
			if t.Failed() {
				t.Logf("--- %s, last 60 lines:\n%s", b.LogPath, b.LogTail(60))
				keepLog(t, b.LogPath)
			}
		})
		w.brokers = append(w.brokers, b)
	}
	e.broker = w.brokers[0]
	e.admin = e.client("admin", adminGroup)
	e.registerGPUs()
	return w
}

// adminClient returns an admin client of replica i.
func (w *chaosWorld) adminClient(i int) *harness.Client {
	return &harness.Client{BaseURL: w.brokers[i].URL, Token: w.admin.Token}
}

// registerAll registers every GPU through the first replica that takes it,
// as the node agents' heartbeats do; errors (a replica down, Redis
// restarting) are retried on the next heartbeat.
func (w *chaosWorld) registerAll(ctx context.Context) {
	for _, g := range w.gpus {
		for i := range w.brokers {
			if w.adminClient(i).PutGPU(ctx, g) == nil {
				break
			}
		}
	}
}

// agents re-registers the GPUs every second until stop, so a flushed or
// restarted Redis gets its inventory back as from the node agents.
func (w *chaosWorld) agents(ctx context.Context, stop <-chan struct{}) {
	everySecond(ctx, stop, func() { w.registerAll(ctx) })
}

// everySecond calls f once a second until stop is closed or ctx ends.
func everySecond(ctx context.Context, stop <-chan struct{}, f func()) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			f()
		}
	}
}

// chaos is the state of one soak.
type chaos struct {
	w     *chaosWorld
	mu    sync.Mutex // guards rnd, faults, answers, violations, order
	rnd   *rand.Rand
	order []string

	faults     map[string]int // injected, by kind
	answers    map[string]int // "<op> <status class>" → count
	violations []string       // seen by the checker during the storm
	checks     int
	// lostWithRedis are servers gone at the end that had no live pod at a
	// loss of Redis's data (a known limit, reported; their Secrets are
	// collected like any other).
	lostWithRedis map[string]bool

	users    []*chaosUser
	spawnKey atomic.Int64 // kill-mid-spawn users
	extra    []*chaosUser // the kill-mid-spawn users, guarded by mu
	flushes  atomic.Int64 // Redis data losses (FLUSHALL or restart) so far
	// podsAtLoss[i] holds "user/server" of every live pod just before data
	// loss i+1; guarded by mu.
	podsAtLoss []map[string]bool
	restarts   sync.WaitGroup
	down       [8]atomic.Bool // replica i is killed and not yet restarted
	// events are the fault steps so far, with their times, and diagnosed
	// the diagnoses logged (chaos_diag_test.go); guarded by mu.
	events    []faultEvent
	diagnosed map[string]bool
}

func (ch *chaos) rand() *rand.Rand {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return rand.New(rand.NewPCG(ch.rnd.Uint64(), ch.rnd.Uint64()))
}

func (ch *chaos) shuffleFaults() {
	r := ch.rand()
	r.Shuffle(len(chaosFaults), func(i, j int) { chaosFaults[i], chaosFaults[j] = chaosFaults[j], chaosFaults[i] })
}

// chaosUser is one client's user and what the API told it about its servers.
type chaosUser struct {
	name    string
	mu      sync.Mutex
	servers map[string]*tracked
}

// tracked is what the owner knows about one server name.
type tracked struct {
	created      bool  // some create was answered 2xx
	deleted      bool  // a delete was answered 2xx after the last 2xx create
	createdFlush int64 // chaos.flushes before the last 2xx create was sent
}

func (u *chaosUser) note(name string, f func(*tracked)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	tr := u.servers[name]
	if tr == nil {
		tr = &tracked{}
		u.servers[name] = tr
	}
	f(tr)
}

func (ch *chaos) answered(op string, status int, err error) {
	key := op + " "
	var ae *harness.APIError
	switch {
	case err == nil:
		key += fmt.Sprintf("%dxx", status/100)
	case errors.As(err, &ae):
		key += fmt.Sprintf("%d", ae.Status)
	default:
		key += "no answer"
	}
	ch.mu.Lock()
	ch.answers[key]++
	ch.mu.Unlock()
}

// liveURL returns the URL of a replica that is not killed (any, when all are).
func (ch *chaos) liveURL(r *rand.Rand) string {
	var live []string
	for i, b := range ch.w.brokers {
		if !ch.down[i].Load() {
			live = append(live, b.URL)
		}
	}
	if len(live) == 0 {
		return ch.w.brokers[r.IntN(len(ch.w.brokers))].URL
	}
	return live[r.IntN(len(live))]
}

// client runs one user's random operations until stop, pacing them 0.3-1.5 s
// apart (a person at a keyboard, not a wait for a condition).
func (ch *chaos) client(ctx context.Context, stop <-chan struct{}, u *chaosUser, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 99))
	tok := ch.w.token(u.name)
	hc := &http.Client{Timeout: 20 * time.Second}
	defer hc.CloseIdleConnections()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(300+r.IntN(1200)) * time.Millisecond):
		}
		cl := &harness.Client{BaseURL: ch.liveURL(r), Token: tok, HTTP: hc}
		name := fmt.Sprintf("nb%d", r.IntN(3))
		switch p := r.IntN(100); {
		case p < 45:
			ch.create(ctx, cl, u, name, r)
		case p < 70:
			status, err := cl.DeleteServer(ctx, u.name, name)
			ch.answered("delete", status, err)
			if err == nil {
				u.note(name, func(tr *tracked) { tr.deleted = tr.created })
			}
		case p < 85:
			cp := 10 + 5*r.IntN(3)
			status, err := cl.Do(ctx, http.MethodPatch, harness.ServerPath(u.name, name)+"/slice", v1.ResizeRequest{ComputePercent: &cp}, nil, nil)
			ch.answered("resize", status, err)
		default:
			status, err := cl.Do(ctx, http.MethodPost, harness.ServerPath(u.name, name)+"/extend", v1.ExtendRequest{Seconds: 600}, nil, nil)
			ch.answered("extend", status, err)
		}
	}
}

// create sends one create with a Secret env (so Secrets are made too) and
// notes a 2xx answer.
func (ch *chaos) create(ctx context.Context, cl *harness.Client, u *chaosUser, name string, r *rand.Rand) {
	profile := "small"
	if r.IntN(4) == 0 {
		profile = "medium"
	}
	req := v1.CreateServerRequest{Profile: profile, SecretEnv: map[string]string{"CHAOS_TOKEN": "t-" + name}}
	// Losses from now on may take the server: one during the request too.
	f := ch.flushes.Load()
	// Tracked before it is sent: a create that got no answer (its broker
	// was killed) may still have started the server, which the end state
	// then reads like any other.
	u.note(name, func(*tracked) {})
	_, status, err := cl.CreateServer(ctx, u.name, name, fmt.Sprintf("%s-%d", name, r.Uint64()), req)
	ch.answered("create", status, err)
	if err == nil {
		u.note(name, func(tr *tracked) { tr.created, tr.deleted, tr.createdFlush = true, false, f })
	}
}

// inject runs one fault of kind and counts it.
func (ch *chaos) inject(ctx context.Context, kind string) error {
	w, r := ch.w, ch.rand()
	c := w.cluster
	zero := int64(0)
	var err error
	switch kind {
	case faultKillBroker:
		err = ch.killReplica(ctx, r, nil)
	case faultKillSpawn:
		n := ch.spawnKey.Add(1)
		u := &chaosUser{name: fmt.Sprintf("spawnkill%03d", n), servers: map[string]*tracked{}}
		ch.mu.Lock()
		ch.extra = append(ch.extra, u)
		ch.mu.Unlock()
		cr := ch.rand() // the create runs beside killReplica, which uses r
		err = ch.killReplica(ctx, r, func(url string) {
			cl := &harness.Client{BaseURL: url, Token: w.token(u.name)}
			ch.create(ctx, cl, u, "nb", cr)
		})
	case faultRedisRestart:
		ch.noteLoss(ctx)
		ch.event("redis restart begins")
		w.redis.Restart()
		ch.event("redis restarted (empty)")
	case faultRedisFlush:
		ch.noteLoss(ctx)
		err = w.redis.Client(w.t).FlushAll(ctx).Err()
		ch.event("redis FLUSHALL")
	case faultAPIRestart:
		ch.event("apiserver restart begins")
		err = c.RestartAPIServer(ctx)
		ch.event("apiserver restarted")
	case faultPodDelete, faultPodEvict:
		pods, lerr := w.pods(ctx)
		if lerr != nil {
			return lerr
		}
		pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning })
		if len(pods) == 0 {
			return nil
		}
		p := pods[r.IntN(len(pods))]
		ch.event("%s pod %s (spawn %s, gpu %s)", kind, p.Name, p.Annotations[v1.AnnotationSpawnID], p.Annotations[v1.AnnotationGPUUUID])
		if kind == faultPodDelete {
			err = c.Client.CoreV1().Pods(w.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		} else {
			p.Status.Phase = corev1.PodFailed
			p.Status.Reason = "Evicted"
			p.Status.Message = "The node was low on resource: memory."
			_, err = c.Client.CoreV1().Pods(w.ns).UpdateStatus(ctx, &p, metav1.UpdateOptions{})
		}
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			err = errNoTarget // the pod moved on since the list
		}
	case faultNodeDelete:
		err = ch.deleteNode(ctx, r)
	default:
		return fmt.Errorf("unknown fault %q", kind)
	}
	if errors.Is(err, errNoTarget) {
		return nil // nothing to hit this time; not counted
	}
	if err != nil {
		return err
	}
	ch.mu.Lock()
	ch.faults[kind]++
	ch.order = append(ch.order, kind)
	ch.mu.Unlock()
	w.t.Logf("chaos: injected %s", kind)
	return nil
}

// noteLoss records the servers with a live pod (not being deleted, not
// ended) just before Redis loses its data: the reconciler must bring
// exactly those back.
func (ch *chaos) noteLoss(ctx context.Context) {
	live := map[string]bool{}
	if pods, err := ch.w.pods(ctx); err == nil {
		for _, p := range pods {
			if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
				live[p.Annotations[v1.AnnotationUser]+"/"+p.Annotations[v1.AnnotationServer]] = true
			}
		}
	}
	ch.mu.Lock()
	ch.podsAtLoss = append(ch.podsAtLoss, live)
	ch.mu.Unlock()
	ch.flushes.Add(1)
}

// podlessAtLoss reports whether key had no live pod at some data loss
// after loss number since: its record then lived only in Redis and went
// with the data (a later restore from its pod at an earlier loss does not
// change that).
func (ch *chaos) podlessAtLoss(key string, since int64) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for i := int(since); i < len(ch.podsAtLoss); i++ {
		if !ch.podsAtLoss[i][key] {
			return true
		}
	}
	return false
}

// killReplica SIGKILLs a running replica (keeping at least one up) and
// starts it again after a 1-3 s pause, in the background. With during set,
// it runs during(url) first and kills the replica 0-300 ms into it.
func (ch *chaos) killReplica(ctx context.Context, r *rand.Rand, during func(url string)) error {
	var up []int
	for i := range ch.w.brokers {
		if !ch.down[i].Load() {
			up = append(up, i)
		}
	}
	if len(up) < 2 {
		return errNoTarget // keep one replica serving
	}
	i := up[r.IntN(len(up))]
	b := ch.w.brokers[i]
	ch.down[i].Store(true)
	var inflight sync.WaitGroup
	if during != nil {
		inflight.Go(func() { during(b.URL) })
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(r.IntN(300)) * time.Millisecond):
		}
	}
	if err := b.Kill(); err != nil {
		return err
	}
	ch.event("replica %d killed (mid-spawn %t)", i, during != nil)
	pause := time.Duration(1000+r.IntN(2000)) * time.Millisecond
	ch.restarts.Go(func() {
		inflight.Wait()
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		ch.event("replica %d starting", i)
		if err := b.Start(ctx); err != nil {
			ch.w.t.Errorf("restart replica %d: %v", i, err)
			return
		}
		ch.event("replica %d started", i)
		ch.down[i].Store(false)
	})
	return nil
}

// deleteNode deletes a node that is up together with its pods (no node
// controller runs to do that) and creates it again after 2-5 s, as a
// replaced machine; its GPUs keep their names.
func (ch *chaos) deleteNode(ctx context.Context, r *rand.Rand) error {
	w := ch.w
	w.mu.Lock()
	var up []string
	for _, n := range w.nodes {
		if !w.nodesDown[n] {
			up = append(up, n)
		}
	}
	if len(up) < 2 {
		w.mu.Unlock()
		return errNoTarget
	}
	node := up[r.IntN(len(up))]
	w.nodesDown[node] = true
	w.mu.Unlock()
	c := w.cluster
	ch.event("node %s deleted", node)
	if err := c.DeleteNodes(ctx, node); err != nil {
		w.mu.Lock()
		delete(w.nodesDown, node)
		w.mu.Unlock()
		return err
	}
	// The node's pods go with it, as Kubernetes' pod garbage collector
	// removes the pods of a node that no longer exists (this cluster runs
	// no controller manager); an API server restarting meanwhile only
	// delays that. Then the node comes back.
	pause := time.Duration(2000+r.IntN(3000)) * time.Millisecond
	ch.restarts.Go(func() {
		if err := harness.Poll(ctx, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
			return w.deletePodsOn(ctx, node)
		}); err != nil {
			w.t.Errorf("delete the pods of deleted node %s: %v", node, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		// The API server may be restarting (another fault): try again
		// until it takes the node.
		if err := harness.Poll(ctx, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
			if err := c.CreateNodes(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
				return false, err.Error(), nil
			}
			return true, "", nil
		}); err != nil {
			w.t.Errorf("recreate node %s: %v", node, err)
			return
		}
		ch.event("node %s back", node)
		w.mu.Lock()
		delete(w.nodesDown, node)
		w.mu.Unlock()
	})
	return nil
}

// deletePodsOn deletes the pods bound to node (at once, grace 0) and says
// whether none is left; an error of the API server is a reason to try
// again, not a failure.
func (w *chaosWorld) deletePodsOn(ctx context.Context, node string) (bool, string, error) {
	zero := int64(0)
	pods, err := w.cluster.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return false, err.Error(), nil
	}
	for _, p := range pods.Items {
		derr := w.cluster.Client.CoreV1().Pods(w.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if derr != nil && !apierrors.IsNotFound(derr) { // the broker may delete it first
			return false, derr.Error(), nil
		}
	}
	return len(pods.Items) == 0, fmt.Sprintf("%d pods on the node", len(pods.Items)), nil
}
