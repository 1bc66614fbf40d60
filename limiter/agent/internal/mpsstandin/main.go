// Command mpsstandin is a test-only stand-in for NVIDIA's
// nvidia-cuda-mps-control, for the node agent's MPS supervision tests. It
// behaves like the real program in what the agent relies on, as NVIDIA's
// MPS documentation describes it (docs.nvidia.com/deploy/mps, "Tools and
// Interface Reference"):
//
//   - "mpsstandin -f" is the control daemon in the foreground. It listens
//     on a socket in $CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps),
//     writes its pid to nvidia-cuda-mps-control.pid there and logs every
//     command to control.log in $CUDA_MPS_LOG_DIRECTORY (default
//     /var/log/nvidia-mps). It keeps state: the default active-thread
//     percentage (100 until set) and pinned device-memory limits, and its
//     servers (one per client uid), each with the limits in force when it
//     was started: set_default_* commands affect only servers started
//     later. "quit" ends it (exit 0); SIGKILL kills it (the tests' crash).
//   - "mpsstandin" without -f is the control client: it sends each line of
//     stdin to the daemon and prints the answers; with no daemon it fails
//     like the real one ("Cannot find MPS control daemon process", exit 1).
//   - "mpsstandin -client <uid>" stands in for a CUDA program connecting as
//     an MPS client: it asks for a server of its uid (started with the
//     daemon's defaults if there is none) and prints the limits it gets,
//     "active_thread_percentage=<p> pinned_mem_limit_mib=<m>". A client may
//     only lower the server's limits with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
//     and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=<n>M"); a higher value is
//     ignored, as the documentation says of the active-thread percentage
//     ("will only further constrain the limit set by the control daemon").
//
// Commands: get_server_list, start_server -uid <uid>, get_client_list
// <pid>, set_default_active_thread_percentage <p>,
// get_default_active_thread_percentage, set_default_device_pinned_mem_limit
// <dev> <n>M, get_default_device_pinned_mem_limit <dev>, quit, and the
// stand-in's connect_client <uid> <p> <mib> behind -client.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const socketName = "control"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipe := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	switch {
	case len(args) == 1 && args[0] == "-f":
		d := &daemon{pipe: pipe, logDir: envOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"), active: 100,
			pinned: map[string]int64{}, nextPID: 40000}
		if err := d.serve(); err != nil {
			fmt.Fprintln(stderr, "mpsstandin:", err)
			return 1
		}
		return 0
	case len(args) == 0:
		return client(pipe, stdin, stdout, stderr)
	case len(args) == 2 && args[0] == "-client":
		pct, mib := int64(100), int64(-1)
		if v := os.Getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); v != "" {
			pct, _ = strconv.ParseInt(v, 10, 64)
		}
		if v := os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); v != "" {
			if _, lim, ok := strings.Cut(v, "="); ok {
				mib, _ = strconv.ParseInt(strings.TrimSuffix(lim, "M"), 10, 64)
			}
		}
		cmd := fmt.Sprintf("connect_client %s %d %d\n", args[1], pct, mib)
		return client(pipe, strings.NewReader(cmd), stdout, stderr)
	default:
		fmt.Fprintln(stderr, "usage: mpsstandin [-f | -client <uid>]")
		return 2
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// client sends stdin's lines to the daemon and copies its answers out.
func client(pipe string, stdin io.Reader, stdout, stderr io.Writer) int {
	conn, err := net.Dial("unix", filepath.Join(pipe, socketName))
	if err != nil {
		fmt.Fprintln(stderr, "Cannot find MPS control daemon process")
		return 1
	}
	defer conn.Close()
	in := bufio.NewScanner(stdin)
	answers := bufio.NewReader(conn)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		if _, err := fmt.Fprintln(conn, line); err != nil {
			fmt.Fprintln(stderr, "mpsstandin: lost the daemon:", err)
			return 1
		}
		// Each answer ends with a line holding only ".".
		for {
			a, err := answers.ReadString('\n')
			if err != nil {
				if line == "quit" {
					return 0
				}
				fmt.Fprintln(stderr, "mpsstandin: lost the daemon:", err)
				return 1
			}
			if a == ".\n" {
				break
			}
			fmt.Fprint(stdout, a)
		}
	}
	return 0
}

// server is one MPS server: its uid and the limits it was started with.
type server struct {
	pid, uid int64
	active   int64
	pinned   map[string]int64 // device → MiB
	clients  []int64
}

type daemon struct {
	pipe, logDir string

	mu      sync.Mutex
	active  int64
	pinned  map[string]int64
	servers []*server
	nextPID int64
	log     *os.File
	ln      net.Listener
}

func (d *daemon) serve() error {
	for _, dir := range []string{d.pipe, d.logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	sock := filepath.Join(d.pipe, socketName)
	if _, err := os.Stat(sock); err == nil {
		// A daemon that was killed leaves its socket; a live one answers.
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return errors.New("another control daemon is running on this pipe directory")
		}
		os.Remove(sock)
	}
	lf, err := os.OpenFile(filepath.Join(d.logDir, "control.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	d.log = lf
	defer lf.Close()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	d.ln = ln
	pidFile := filepath.Join(d.pipe, "nvidia-cuda-mps-control.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	d.logf("Startup")
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				os.Remove(pidFile)
				d.logf("Exit")
				return nil
			}
			return err
		}
		go d.handle(c)
	}
}

func (d *daemon) logf(format string, args ...any) {
	fmt.Fprintf(d.log, "[%s] %s\n", time.Now().UTC().Format("2006-01-02 15:04:05.000"), fmt.Sprintf(format, args...))
}

func (d *daemon) handle(c net.Conn) {
	defer c.Close()
	in := bufio.NewScanner(c)
	for in.Scan() {
		line := in.Text()
		answer, quit := d.command(strings.Fields(line))
		d.mu.Lock()
		d.logf("User: %s", line)
		d.mu.Unlock()
		if answer != "" {
			fmt.Fprintln(c, answer)
		}
		fmt.Fprintln(c, ".")
		if quit {
			d.ln.Close()
			return
		}
	}
}

// command runs one command and returns its answer ("" for none) and
// whether the daemon quits.
func (d *daemon) command(f []string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(f) == 0 {
		return "", false
	}
	arg := func(i int) int64 {
		if i >= len(f) {
			return -1
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(f[i], "M"), 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
	switch f[0] {
	case "quit":
		return "", true
	case "get_server_list":
		var pids []string
		for _, s := range d.servers {
			pids = append(pids, strconv.FormatInt(s.pid, 10))
		}
		return strings.Join(pids, "\n"), false
	case "start_server":
		if len(f) != 3 || f[1] != "-uid" || arg(2) < 0 {
			return "usage: start_server -uid <user id>", false
		}
		return strconv.FormatInt(d.server(arg(2)).pid, 10), false
	case "get_client_list":
		for _, s := range d.servers {
			if s.pid == arg(1) {
				var out []string
				for _, c := range s.clients {
					out = append(out, strconv.FormatInt(c, 10))
				}
				return strings.Join(out, "\n"), false
			}
		}
		return "", false
	case "set_default_active_thread_percentage":
		if p := arg(1); p >= 1 && p <= 100 {
			d.active = p
			return strconv.FormatInt(p, 10), false
		}
		return "invalid percentage", false
	case "get_default_active_thread_percentage":
		return fmt.Sprintf("%.1f", float64(d.active)), false
	case "set_default_device_pinned_mem_limit":
		if len(f) != 3 || arg(2) < 0 {
			return "usage: set_default_device_pinned_mem_limit <dev> <value>M", false
		}
		d.pinned[f[1]] = arg(2)
		return "", false
	case "get_default_device_pinned_mem_limit":
		if m, ok := d.pinned[f[len(f)-1]]; ok {
			return fmt.Sprintf("%dM", m), false
		}
		return "none", false
	case "connect_client":
		uid, pct, mib := arg(1), arg(2), arg(3)
		s := d.server(uid)
		d.nextPID++
		s.clients = append(s.clients, d.nextPID)
		act := min(pct, s.active)
		lim, ok := s.pinned["0"]
		switch {
		case !ok && mib < 0:
			lim = -1
		case !ok:
			lim = mib
		case mib >= 0:
			lim = min(lim, mib)
		}
		return fmt.Sprintf("active_thread_percentage=%d pinned_mem_limit_mib=%d", act, lim), false
	}
	return "", false
}

// server returns the server of uid, starting one with the current
// defaults if there is none (the real daemon also stops other uids'
// servers once their clients are done; the stand-in keeps them).
func (d *daemon) server(uid int64) *server {
	for _, s := range d.servers {
		if s.uid == uid {
			return s
		}
	}
	d.nextPID++
	s := &server{pid: d.nextPID, uid: uid, active: d.active, pinned: map[string]int64{}}
	for dev, m := range d.pinned {
		s.pinned[dev] = m
	}
	d.servers = append(d.servers, s)
	sort.Slice(d.servers, func(i, j int) bool { return d.servers[i].pid < d.servers[j].pid })
	return s
}
