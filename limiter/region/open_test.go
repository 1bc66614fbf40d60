package region

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// specialFiles plants, in dir, what could stand at a region path instead of
// the region: a symbolic link to a file that must not be touched, a FIFO
// (whose open would block), a listening unix socket, a directory, a
// truncated and an oversized file. It returns name → path and the victim.
func specialFiles(t *testing.T, dir string, size int) (map[string]string, string) {
	t.Helper()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{}
	for _, name := range []string{"symlink", "fifo", "socket", "directory", "truncated", "oversized"} {
		paths[name] = filepath.Join(dir, name+".bin")
	}
	if err := os.Symlink(victim, paths["symlink"]); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(paths["fifo"], 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", paths["socket"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := os.Mkdir(paths["directory"], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(paths["truncated"], make([]byte, size-1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(paths["oversized"], make([]byte, size+4096), 0o600); err != nil {
		t.Fatal(err)
	}
	return paths, victim
}

// TestRegionFilesAreNeverFollowedOrBlockedOn puts each special file at a
// region path: every reader and writer refuses it (ErrNotRegular for what is
// not a regular file, ErrCorrupt for the wrong size), within a deadline (a
// FIFO must not block), and the symbolic link's target is never written.
func TestRegionFilesAreNeverFollowedOrBlockedOn(t *testing.T) {
	for _, region := range []struct {
		name string
		size int
		op   func(path string) error
	}{
		{"ReadUsage", UsageSize, func(p string) error { _, err := ReadUsage(p); return err }},
		{"WriteAgentSample", UsageSize, func(p string) error {
			return WriteAgentSample(p, AgentSample{Time: time.Unix(1, 0), SliceUtilPermille: 500})
		}},
		{"CreateUsage", UsageSize, CreateUsage},
		{"ReadQuota", QuotaSize, func(p string) error { _, err := ReadQuota(p); return err }},
	} {
		t.Run(region.name, func(t *testing.T) {
			paths, victim := specialFiles(t, t.TempDir(), region.size)
			for name, path := range paths {
				t.Run(name, func(t *testing.T) {
					done := make(chan error, 1)
					go func() { done <- region.op(path) }()
					var err error
					select {
					case err = <-done:
					case <-time.After(10 * time.Second):
						t.Fatalf("%s(%s) did not return within 10 s", region.name, name)
					}
					want := ErrNotRegular
					if name == "truncated" || name == "oversized" {
						want = ErrCorrupt
					}
					if !errors.Is(err, want) {
						t.Errorf("%s(%s) = %v, want %v", region.name, name, err, want)
					}
				})
			}
			b, err := os.ReadFile(victim)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range b {
				if c != 0 {
					t.Fatalf("the link's target was written at byte %d", i)
				}
			}
		})
	}
}

// TestWriteQuotaReplacesSpecialFiles: the agent's writer never opens what
// stands at the quota path; it renames a new file over it, within a deadline.
func TestWriteQuotaReplacesSpecialFiles(t *testing.T) {
	paths, victim := specialFiles(t, t.TempDir(), QuotaSize)
	for name, path := range paths {
		if name == "directory" {
			continue // rename(2) cannot replace a directory by a file: an error, below
		}
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- WriteQuota(path, validQuota()) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("WriteQuota over a %s: %v", name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("WriteQuota over a %s did not return within 10 s", name)
			}
			if q, err := ReadQuota(path); err != nil || q != validQuota() {
				t.Errorf("after WriteQuota over a %s: %+v, %v", name, q, err)
			}
		})
	}
	if err := WriteQuota(paths["directory"], validQuota()); err == nil {
		t.Error("WriteQuota over a directory succeeded")
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != string(make([]byte, QuotaSize)) {
		t.Errorf("the link's target changed: %v", err)
	}
}
