package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// ProcCPU is the user+system CPU time of process pid in seconds, from
// /proc/<pid>/stat (utime and stime).
func ProcCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it follow ')'.
	rest := string(b[bytes.LastIndexByte(b, ')')+2:])
	f := strings.Fields(rest) // f[0] is field 3 (state); utime is field 14
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return (ut + st) / clockTicks, nil
}

// MachineCPU is the CPU time all processes of the machine used so far, in
// seconds (user, nice, system, irq and softirq of /proc/stat's "cpu" line;
// guest time is already in user, steal is not this machine's):
// against the processes one measures, it shows what else ran meanwhile.
func MachineCPU() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	var busy float64
	for i, v := range f[1:min(len(f), 8)] {
		t, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		switch i {
		case 0, 1, 2, 5, 6:
			busy += t
		}
	}
	return busy / clockTicks, nil
}

// ProcRSS is the resident set (VmRSS) of process pid in KiB, from
// /proc/<pid>/status.
func ProcRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// Metrics is one scrape of a Prometheus text page: each series, written
// as on the page (name{labels}), with its value.
type Metrics map[string]float64

// Sum is the sum of every series of the metric name (any labels).
func (m Metrics) Sum(name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// Delta is m - before for every series of m (a series missing from before
// counts from 0); series that did not change are left out.
func (m Metrics) Delta(before Metrics) Metrics {
	out := Metrics{}
	for k, v := range m {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Top lists the series of metric name in m by value, largest first, at
// most n of them, as "labels=value" strings.
func (m Metrics) Top(name string, n int) []string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range m {
		if strings.HasPrefix(k, name+"{") {
			all = append(all, kv{strings.TrimPrefix(k, name), v})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || (all[i].v == all[j].v && all[i].k < all[j].k) })
	var out []string
	for _, e := range all[:min(n, len(all))] {
		out = append(out, fmt.Sprintf("%s=%g", e.k, e.v))
	}
	return out
}

// Scrape reads the broker's /metrics.
func (b *Broker) Scrape(ctx context.Context) (Metrics, error) {
	return ScrapeMetrics(ctx, b.MetricsURL+"/metrics")
}

// ScrapeMetrics reads the Prometheus text page at url.
func ScrapeMetrics(ctx context.Context, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: HTTP %d", url, resp.StatusCode)
	}
	out := Metrics{}
	for line := range strings.SplitSeq(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("scrape %s: %q: %w", url, line, err)
		}
		out[line[:i]] = v
	}
	return out, nil
}

// PodWatch follows the pods of one namespace that match a label selector
// through an informer and tells when each one (by name) is first seen
// Running. Stop ends it. Its methods are safe for concurrent use.
type PodWatch struct {
	mu      sync.Mutex
	running map[string]chan struct{}
	stop    func()
	inf     cache.SharedIndexInformer
}

// WatchPods starts a PodWatch on namespace ns for pods matching selector
// and waits until its informer has synced.
func WatchPods(ctx context.Context, cs kubernetes.Interface, ns, selector string) (*PodWatch, error) {
	w := &PodWatch{running: map[string]chan struct{}{}}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	w.inf = factory.Core().V1().Pods().Informer()
	seen := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Status.Phase == corev1.PodRunning {
			ch := w.ch(p.Name)
			w.mu.Lock()
			select {
			case <-ch:
			default:
				close(ch)
			}
			w.mu.Unlock()
		}
	}
	if _, err := w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		return nil, err
	}
	ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.stop = func() { cancel(); factory.Shutdown() }
	factory.Start(ictx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), w.inf.HasSynced) {
		w.stop()
		return nil, errors.New("pod informer did not sync")
	}
	return w, nil
}

func (w *PodWatch) ch(name string) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.running[name]
	if !ok {
		ch = make(chan struct{})
		w.running[name] = ch
	}
	return ch
}

// Running returns a channel closed once pod name has been seen Running.
func (w *PodWatch) Running(name string) <-chan struct{} { return w.ch(name) }

// Count is the number of matching pods the informer holds now.
func (w *PodWatch) Count() int { return len(w.inf.GetStore().ListKeys()) }

// Stop ends the informer.
func (w *PodWatch) Stop() { w.stop() }
