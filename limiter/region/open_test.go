package region

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRegionFilesAreNeverFollowedOrBlockedOn plants what a tenant could put
// in its writable usage directory in place of the usage file: a symbolic
// link to a file it must not touch, and a FIFO that would block a reader.
// Neither is followed, read or written.
func TestRegionFilesAreNeverFollowedOrBlockedOn(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, make([]byte, UsageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.bin")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.bin")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{link, fifo} {
		if err := WriteAgentSample(path, AgentSample{Time: time.Unix(1, 0), SliceUtilPermille: 500}); !errors.Is(err, ErrNotRegular) {
			t.Errorf("WriteAgentSample(%s) = %v, want ErrNotRegular", filepath.Base(path), err)
		}
		if _, err := ReadUsage(path); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadUsage(%s) = %v, want ErrNotRegular", filepath.Base(path), err)
		}
		if _, err := ReadQuota(path); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadQuota(%s) = %v, want ErrNotRegular", filepath.Base(path), err)
		}
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
}
