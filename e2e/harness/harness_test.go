package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestPoll covers Poll and PollProgress (progress: the limit is a stall,
// not a deadline).
func TestPoll(t *testing.T) {
	errStop := errors.New("stop")
	tests := []struct {
		name      string
		progress  bool
		cond      func(calls int) (bool, string, error)
		limit     time.Duration // Poll's timeout or PollProgress's stall
		wantErr   error
		wantCalls int    // 0: at least one
		wantText  string // in a timeout's error
	}{
		{name: "done at once is one call", cond: func(int) (bool, string, error) { return true, "", nil }, limit: time.Second, wantCalls: 1},
		{name: "done on the third call", cond: func(n int) (bool, string, error) { return n == 3, "", nil }, limit: 10 * time.Second, wantCalls: 3},
		{name: "an error stops at once", cond: func(int) (bool, string, error) { return false, "", errStop }, limit: time.Second, wantErr: errStop, wantCalls: 1},
		{name: "never done times out", cond: func(int) (bool, string, error) { return false, "waiting", nil }, limit: 50 * time.Millisecond, wantErr: ErrTimeout, wantText: "waiting"},
		{name: "progress: done at once is one call", progress: true, cond: func(int) (bool, string, error) { return true, "", nil }, limit: 50 * time.Millisecond, wantCalls: 1},
		{name: "progress: an error stops at once", progress: true, cond: func(int) (bool, string, error) { return false, "", errStop }, limit: 50 * time.Millisecond, wantErr: errStop, wantCalls: 1},
		{name: "progress: no change stalls", progress: true, cond: func(int) (bool, string, error) { return false, "waiting", nil }, limit: 50 * time.Millisecond, wantErr: ErrTimeout, wantText: "no progress"},
		// 200 calls 1 ms apart outlast the 50 ms stall many times over:
		// only the changing status keeps the wait going.
		{name: "progress: a changing status waits past the stall", progress: true, cond: func(n int) (bool, string, error) { return n == 200, strconv.Itoa(n), nil }, limit: 50 * time.Millisecond, wantCalls: 200},
		{name: "progress: a status that stops changing stalls", progress: true, cond: func(n int) (bool, string, error) { return false, strconv.Itoa(min(n, 5)), nil }, limit: 50 * time.Millisecond, wantErr: ErrTimeout, wantText: "(last: 5)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			cond := func(context.Context) (bool, string, error) {
				calls++
				return tc.cond(calls)
			}
			var err error
			if tc.progress {
				err = PollProgress(t.Context(), time.Millisecond, tc.limit, cond)
			} else {
				err = Poll(t.Context(), time.Millisecond, tc.limit, cond)
			}
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("got %v, want %v", err, tc.wantErr)
			}
			if tc.wantCalls != 0 && calls != tc.wantCalls {
				t.Errorf("cond called %d times, want %d", calls, tc.wantCalls)
			}
			if errors.Is(err, ErrTimeout) && !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("timeout error %q lacks %q", err, tc.wantText)
			}
		})
	}
}

func TestUniqueName(t *testing.T) {
	tests := []struct{ name, base string }{
		{name: "plain", base: "TestServerLifecycle"},
		{name: "subtest with slash and spaces", base: "TestTokenMatrix/wrong audience"},
		{name: "long", base: strings.Repeat("TestVeryLongName", 10)},
		{name: "only punctuation", base: "///"},
		{name: "unicode", base: "Tëst_ünïcode"},
	}
	seen := map[string]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 {
				n := UniqueName(tc.base)
				if errs := validation.IsDNS1123Label(n); len(errs) > 0 || len(n) > 40 {
					t.Errorf("UniqueName(%q) = %q: not a DNS-1123 label of at most 40 characters: %v", tc.base, n, errs)
				}
				if seen[n] {
					t.Errorf("UniqueName(%q) = %q twice", tc.base, n)
				}
				seen[n] = true
			}
		})
	}
}

// TestProcessStopKillsGroupThatIgnoresTerm starts a shell that ignores
// SIGTERM and has a child; Stop must fall back to SIGKILL for the whole
// group within the grace period plus a margin.
func TestProcessStopKillsGroupThatIgnoresTerm(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "p.log")
	p, err := StartProcess("stubborn", log, nil, "/bin/bash", "-c", `trap "" TERM; sleep 300 & echo "child $!"; wait`)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var child int
	err = Poll(t.Context(), 10*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
		b, err := os.ReadFile(log)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, line := range strings.Split(string(b), "\n") {
			if s, ok := strings.CutPrefix(line, "child "); ok {
				child, err = strconv.Atoi(s)
				return err == nil, "", err
			}
		}
		return false, "no child pid yet", nil
	})
	if err != nil {
		_ = p.Kill()
		t.Fatalf("child pid: %v", err)
	}
	start := time.Now()
	if err := p.Stop(200 * time.Millisecond); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 10*time.Second {
		t.Errorf("Stop took %s, want the 200ms grace then SIGKILL", d)
	}
	select {
	case <-p.Exited():
	default:
		t.Errorf("process not reaped after Stop")
	}
	err = Poll(t.Context(), 10*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
		return gone(child), fmt.Sprintf("child %d still alive", child), nil
	})
	if err != nil {
		t.Errorf("group member: %v", err)
	}
}

// gone reports whether pid no longer runs (absent or a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestFindToolsNamesEveryMissingPart(t *testing.T) {
	dir := t.TempDir()
	_, err := FindTools(dir)
	if !errors.Is(err, ErrToolsMissing) {
		t.Fatalf("FindTools(empty dir): %v, want ErrToolsMissing", err)
	}
	for _, name := range []string{"kube-apiserver", "etcd", "kwok", "kwok-stages.yaml", "go tool task e2e:tools"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not mention %q", err, name)
		}
	}
}
