package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// SentinelBinary is Debian's redis-sentinel (package redis-sentinel).
const SentinelBinary = "/usr/bin/redis-sentinel"

// FailoverOptions shape StartFailover's setup. Zero values take the
// defaults.
type FailoverOptions struct {
	// MasterName is the name the Sentinels monitor; default "gpubroker".
	MasterName string
	// DownAfter is Sentinel's down-after-milliseconds: how long the master
	// must not answer before a Sentinel counts it down; default 1 s.
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout; default 5 s.
	FailoverTimeout time.Duration
}

// Failover is a Redis master, one replica of it and three Sentinels
// monitoring it (quorum 2), each a process on a loopback port, for tests
// of a failover. Its methods are safe for concurrent use.
type Failover struct {
	// MasterName is the monitored master's name.
	MasterName string
	// Master and Replica are the data servers as started; after a failover
	// the Replica is the master.
	Master, Replica *Process
	// Options are the options the setup runs with (defaults filled in).
	Options FailoverOptions

	sentinels []*sentinel
}

// StartFailover starts the master, the replica (waiting until it is in
// sync) and three Sentinels (waiting until each knows the replica and the
// two other Sentinels, so that a failover can be voted), and stops them
// all when tb ends. Without redis-server or redis-sentinel it fails tb
// naming the package (skips it under -short).
func StartFailover(tb testing.TB, o FailoverOptions) *Failover {
	tb.Helper()
	testdeps.Need(tb, DefaultBinary)
	testdeps.Need(tb, SentinelBinary)
	if o.MasterName == "" {
		o.MasterName = "gpubroker"
	}
	if o.DownAfter <= 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout <= 0 {
		o.FailoverTimeout = 5 * time.Second
	}
	ctx := tb.Context()
	f := &Failover{MasterName: o.MasterName, Options: o}
	dir := func(name string) string {
		d := filepath.Join(tb.TempDir(), name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		return d
	}
	var err error
	if f.Master, err = StartProcess(ctx, dir("master")); err != nil {
		tb.Fatalf("redistest: master: %v", err)
	}
	tb.Cleanup(f.Master.Stop)
	if f.Replica, err = StartProcess(ctx, dir("replica"), "--replicaof", "127.0.0.1", strconv.Itoa(f.Master.Port())); err != nil {
		tb.Fatalf("redistest: replica: %v", err)
	}
	tb.Cleanup(f.Replica.Stop)
	if err := waitSynced(ctx, f.Master, f.Replica); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	for i := range 3 {
		s, err := startSentinel(ctx, dir(fmt.Sprintf("sentinel-%d", i)), f.Master.Port(), o)
		if err != nil {
			tb.Fatalf("redistest: sentinel %d: %v", i, err)
		}
		tb.Cleanup(s.stop)
		f.sentinels = append(f.sentinels, s)
	}
	for _, s := range f.sentinels {
		if err := s.waitKnows(ctx, o.MasterName, 2, 1, 20*time.Second); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
	}
	return f
}

// StartReplica starts a replica of master (a redis-server with
// --replicaof) for tb, waits until it is in sync, and stops it when tb
// ends.
func StartReplica(tb testing.TB, master *Process) *Process {
	tb.Helper()
	testdeps.Need(tb, DefaultBinary)
	p, err := StartProcess(tb.Context(), tb.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(master.Port()))
	if err != nil {
		tb.Fatalf("redistest: replica: %v", err)
	}
	tb.Cleanup(p.Stop)
	if err := waitSynced(tb.Context(), master, p); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return p
}

// waitSynced waits until replica is in sync with master: the replica's
// link is up, the master lists it online, and it has received a message
// published on the master after that. The last step matters: after a
// diskless full sync (Redis 7's default) the master starts streaming
// writes to the replica only once the replica first acknowledged, which it
// does once a second, so a WAIT right after "online" could take that
// long. PUBLISH is replicated and writes no key.
func waitSynced(ctx context.Context, master, replica *Process) error {
	if err := waitInfo(ctx, replica.Addr(), "replication", "master_link_status:up", 10*time.Second); err != nil {
		return fmt.Errorf("replica not in sync: %w", err)
	}
	if err := waitInfo(ctx, master.Addr(), "replication", fmt.Sprintf("port=%d,state=online", replica.Port()), 10*time.Second); err != nil {
		return fmt.Errorf("master does not list the replica online: %w", err)
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr(), ContextTimeoutEnabled: true})
	defer mc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), ContextTimeoutEnabled: true})
	defer rc.Close()
	if err := mc.Publish(ctx, "redistest:synced", "").Err(); err != nil {
		return fmt.Errorf("publish on the master: %w", err)
	}
	want, err := replOffset(ctx, mc, "master_repl_offset")
	if err != nil {
		return err
	}
	if err := poll(ctx, 10*time.Second, func(ctx context.Context) (bool, string) {
		got, err := replOffset(ctx, rc, "slave_repl_offset")
		if err != nil {
			return false, err.Error()
		}
		return got >= want, fmt.Sprintf("replica at offset %d", got)
	}); err != nil {
		return fmt.Errorf("replica %s does not reach the master's offset %d (%w)", replica.Addr(), want, err)
	}
	return nil
}

// replOffset reads a replication offset field of INFO replication.
func replOffset(ctx context.Context, c *redis.Client, field string) (int64, error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return 0, fmt.Errorf("%s: INFO replication: %w", c.Options().Addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: INFO replication has no %s", c.Options().Addr, field)
}

// SentinelAddrs returns the Sentinels' host:port addresses.
func (f *Failover) SentinelAddrs() []string {
	out := make([]string, len(f.sentinels))
	for i, s := range f.sentinels {
		out[i] = s.addr
	}
	return out
}

// MasterAddr asks the Sentinels, in turn, for the master's address.
func (f *Failover) MasterAddr(ctx context.Context) (string, error) {
	var errs []error
	for _, s := range f.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true})
		addr, err := c.GetMasterAddrByName(ctx, f.MasterName).Result()
		_ = c.Close()
		if err == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1]), nil
		}
		errs = append(errs, fmt.Errorf("sentinel %s: %w", s.addr, err))
	}
	return "", errors.Join(errs...)
}

// WaitNewMaster waits up to timeout until the Sentinels name a master
// other than old and that server answers as a master, and returns its
// address.
func (f *Failover) WaitNewMaster(ctx context.Context, old string, timeout time.Duration) (string, error) {
	var master string
	err := poll(ctx, timeout, func(ctx context.Context) (bool, string) {
		addr, err := f.MasterAddr(ctx)
		switch {
		case err != nil:
			return false, err.Error()
		case addr == old:
			return false, "still " + old
		case waitInfo(ctx, addr, "replication", "role:master", 0) != nil:
			return false, addr + " is not a master yet"
		}
		master = addr
		return true, ""
	})
	if err != nil {
		return "", fmt.Errorf("no new master after %s (%w)", timeout, err)
	}
	return master, nil
}

// poll calls cond every 50 ms until it reports done, for at most timeout.
// The error names what cond last saw and wraps the context's error.
func poll(ctx context.Context, timeout time.Duration, cond func(context.Context) (done bool, saw string)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		done, saw := cond(ctx)
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("last: %s: %w", saw, ctx.Err())
		case <-tick.C:
		}
	}
}

// sentinel is one redis-sentinel process.
type sentinel struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	once   sync.Once
}

func startSentinel(ctx context.Context, dir string, masterPort int, o FailoverOptions) (*sentinel, error) {
	var errs []error
	for range bindAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := runSentinel(ctx, dir, port, masterPort, o)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func runSentinel(ctx context.Context, dir string, port, masterPort int, o FailoverOptions) (*sentinel, error) {
	conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it: its own file
	logFile := filepath.Join(dir, "sentinel.log")
	text := strings.Join([]string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(port),
		"daemonize no",
		"protected-mode no",
		"dir " + dir,
		"logfile " + logFile,
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", o.MasterName, masterPort),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", o.MasterName, o.DownAfter.Milliseconds()),
		fmt.Sprintf("sentinel failover-timeout %s %d", o.MasterName, o.FailoverTimeout.Milliseconds()),
		fmt.Sprintf("sentinel parallel-syncs %s 1", o.MasterName),
	}, "\n") + "\n"
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(SentinelBinary, conf) // #nosec G204 -- test support runs Debian's redis-sentinel
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", SentinelBinary, err)
	}
	s := &sentinel{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	wctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := waitPong(wctx, s.addr, s.exited); err != nil {
		s.stop()
		return nil, fmt.Errorf("redis-sentinel on port %d: %w (log: %s)", port, err, tail(logFile))
	}
	return s, nil
}

// waitKnows waits until the Sentinel sees the master with replicas
// replicas and others other Sentinels.
func (s *sentinel) waitKnows(ctx context.Context, master string, others, replicas int, timeout time.Duration) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true})
	defer c.Close()
	err := poll(ctx, timeout, func(ctx context.Context) (bool, string) {
		m, err := c.Master(ctx, master).Result()
		if err != nil {
			return false, err.Error()
		}
		return m["num-other-sentinels"] == strconv.Itoa(others) && m["num-slaves"] == strconv.Itoa(replicas),
			fmt.Sprintf("%s other sentinels, %s replicas", m["num-other-sentinels"], m["num-slaves"])
	})
	if err != nil {
		return fmt.Errorf("sentinel %s does not know %d sentinels and %d replicas (%w)", s.addr, others, replicas, err)
	}
	return nil
}

func (s *sentinel) stop() {
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		t := time.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-s.exited:
		case <-t.C:
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	})
}

// waitInfo waits up to timeout (0: one try) until INFO section at addr
// contains line.
func waitInfo(ctx context.Context, addr, section, line string, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		info, err := c.Info(ctx, section).Result()
		if err == nil && strings.Contains(info, line) {
			return nil
		}
		if !time.Now().Before(deadline) {
			if err == nil {
				err = fmt.Errorf("INFO %s has no %q", section, line)
			}
			return fmt.Errorf("%s: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
