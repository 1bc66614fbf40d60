// Package jupytertest runs Debian's Jupyter notebook server for tests and
// talks to notebook servers the way a browser does: the REST API for
// kernels and the kernel WebSocket (Jupyter messaging protocol 5.3) to run
// code. It is test support, like broker/redistest.
//
// Start runs /usr/bin/python3 -m notebook (python3-notebook 6.4; the
// python3 on PATH may be another interpreter) on a loopback address under
// a base URL with a token, in its own process group, and stops it when the
// test ends. Without the package the test fails, naming the Debian
// package (e2e/testdeps), or skips under -short.
//
// Client works against any notebook base URL, straight or through the
// broker's proxy, with whatever credentials it is given.
package jupytertest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// Python is Debian's interpreter, which has the notebook package.
const Python = "/usr/bin/python3"

// Options configure Start.
type Options struct {
	// Base is the notebook's base URL, "/" or "/a/b/" (default "/").
	Base string
	// Token is the notebook's token (JUPYTER_TOKEN); default a random one.
	Token string
	// IP is the address it listens on; default 127.0.0.1.
	IP string
}

// Server is a running notebook server.
type Server struct {
	// URL is http://<ip>:<port><base>, ending in "/".
	URL string
	// Addr is <ip>:<port>.
	Addr string
	// Token is its token.
	Token string
	// Log is the path of its output.
	Log string
}

// Start runs a notebook server for tb and waits until it answers (at most
// 60 s); it is stopped (SIGTERM to its group, SIGKILL after 5 s) when tb
// ends.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	testdeps.Need(tb, "py:notebook")
	testdeps.Need(tb, "py:ipykernel")
	if o.Base == "" {
		o.Base = "/"
	}
	if o.Token == "" {
		o.Token = rand.Text()
	}
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.IP, "0"))
	if err != nil {
		tb.Fatalf("jupytertest: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	home := tb.TempDir()
	s := &Server{Addr: net.JoinHostPort(o.IP, strconv.Itoa(port)), Token: o.Token, Log: filepath.Join(home, "notebook.log")}
	s.URL = "http://" + s.Addr + o.Base
	cmd := exec.Command(Python, "-m", "notebook", "--no-browser", "--allow-root", "--ip="+o.IP, "--port="+strconv.Itoa(port),
		"--NotebookApp.base_url="+o.Base, "--NotebookApp.port_retries=0", "--NotebookApp.log_level=WARN")
	cmd.Env = []string{"HOME=" + home, "JUPYTER_TOKEN=" + o.Token, "PATH=/usr/bin:/bin", "XDG_RUNTIME_DIR=" + filepath.Join(home, "run")}
	cmd.Dir = home
	log, err := os.Create(s.Log)
	if err != nil {
		tb.Fatalf("jupytertest: %v", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		tb.Fatalf("jupytertest: start %s: %v", Python, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(exited) }()
	tb.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.URL + "api")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-exited:
			tb.Fatalf("jupytertest: the notebook server exited:\n%s", tail(s.Log))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("jupytertest: the notebook server did not answer within 60s:\n%s", tail(s.Log))
		}
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Client talks to one notebook server at Base (its base URL, ending in
// "/"), straight or through a proxy, sending Header with every request
// and Origin with WebSocket handshakes.
type Client struct {
	Base   string
	Header http.Header
	Origin string
	// HTTP is the client of REST calls; nil means one with a 30 s timeout.
	HTTP *http.Client
}

// ForServer is a Client straight to s with its token.
func ForServer(s *Server) Client {
	return Client{Base: s.URL, Header: http.Header{"Authorization": {"token " + s.Token}}, Origin: "http://" + s.Addr}
}

// Kernel is one entry of GET api/kernels.
type Kernel struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	ExecutionState string `json:"execution_state"`
}

// do sends a REST request and decodes a 2xx JSON answer into out.
func (c Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return err
	}
	for k, v := range c.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &StatusError{Status: resp.StatusCode, Body: string(raw)}
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %.300s", e.Status, e.Body) }

// StartKernel starts a python3 kernel and returns its id.
func (c Client) StartKernel(ctx context.Context) (string, error) {
	var k Kernel
	if err := c.do(ctx, http.MethodPost, "api/kernels", map[string]string{"name": "python3"}, &k); err != nil {
		return "", fmt.Errorf("start kernel: %w", err)
	}
	return k.ID, nil
}

// Kernels lists the running kernels.
func (c Client) Kernels(ctx context.Context) ([]Kernel, error) {
	var ks []Kernel
	err := c.do(ctx, http.MethodGet, "api/kernels", nil, &ks)
	return ks, err
}

// message is a Jupyter message on the kernel WebSocket.
type message struct {
	Header       map[string]any `json:"header"`
	ParentHeader map[string]any `json:"parent_header"`
	Metadata     map[string]any `json:"metadata"`
	Content      map[string]any `json:"content"`
	Channel      string         `json:"channel"`
	Buffers      []any          `json:"buffers"`
}

// Execute runs code on kernel id over its WebSocket. With wait it returns
// the cell's stdout once the kernel is idle again; without, it returns ""
// as soon as the kernel reports busy with the cell (which keeps running
// after the socket closes). ctx bounds it.
func (c Client) Execute(ctx context.Context, kernelID, code string, wait bool) (string, error) {
	u, err := url.Parse(c.Base + "api/kernels/" + kernelID + "/channels?session_id=" + rand.Text())
	if err != nil {
		return "", err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	cfg, err := websocket.NewConfig(u.String(), c.Origin)
	if err != nil {
		return "", err
	}
	for k, v := range c.Header {
		cfg.Header[k] = v
	}
	cfg.Dialer = &net.Dialer{Timeout: 10 * time.Second}
	ws, err := cfg.DialContext(ctx)
	if err != nil {
		return "", fmt.Errorf("kernel websocket %s: %w", u.Redacted(), err)
	}
	defer ws.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = ws.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { ws.Close() })
	defer stop()
	msgID := rand.Text()
	req := message{
		Header: map[string]any{"msg_id": msgID, "username": "test", "session": rand.Text(), "msg_type": "execute_request",
			"version": "5.3", "date": time.Now().UTC().Format(time.RFC3339Nano)},
		ParentHeader: map[string]any{}, Metadata: map[string]any{}, Channel: "shell", Buffers: []any{},
		Content: map[string]any{"code": code, "silent": false, "store_history": true, "user_expressions": map[string]any{},
			"allow_stdin": false, "stop_on_error": true},
	}
	if err := websocket.JSON.Send(ws, req); err != nil {
		return "", fmt.Errorf("send execute_request: %w", err)
	}
	var out strings.Builder
	for {
		var m message
		if err := websocket.JSON.Receive(ws, &m); err != nil {
			if ctx.Err() != nil {
				return out.String(), ctx.Err()
			}
			return out.String(), fmt.Errorf("kernel websocket: %w", err)
		}
		if m.ParentHeader["msg_id"] != msgID {
			continue
		}
		switch m.Header["msg_type"] {
		case "stream":
			if m.Content["name"] == "stdout" {
				s, _ := m.Content["text"].(string)
				out.WriteString(s)
			}
		case "error":
			return out.String(), fmt.Errorf("the cell failed: %v: %v", m.Content["ename"], m.Content["evalue"])
		case "status":
			switch m.Content["execution_state"] {
			case "busy":
				if !wait {
					return "", nil
				}
			case "idle":
				return out.String(), nil
			}
		}
	}
}
