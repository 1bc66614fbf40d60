package hook_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/limiter/region"
)

// specialKinds are what may stand at a region path instead of the region
// (a host-side mistake, or root in the container at the usage path).
var specialKinds = []string{"fifo", "socket", "directory", "symlink", "truncated", "oversized"}

// plant replaces whatever is at path by a special file of kind; size is the
// region's size and good a valid region image (the symbolic link points at a
// copy of it elsewhere, the truncated and oversized files are cut from it).
func plant(t *testing.T, path, kind string, good []byte) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	switch kind {
	case "fifo":
		if err := syscall.Mkfifo(path, 0o666); err != nil {
			t.Fatal(err)
		}
	case "socket":
		// Made in a short directory (unix socket paths are short), then moved into place.
		dir, err := os.MkdirTemp("", "gpl")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		ln, err := net.Listen("unix", filepath.Join(dir, "s"))
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		t.Cleanup(func() { ln.Close() })
		if err := os.Rename(filepath.Join(dir, "s"), path); err != nil {
			t.Fatal(err)
		}
	case "directory":
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
	case "symlink":
		target := filepath.Join(t.TempDir(), "elsewhere.bin")
		if err := os.WriteFile(target, good, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	case "truncated":
		if err := os.WriteFile(path, good[:len(good)-1], 0o666); err != nil {
			t.Fatal(err)
		}
	case "oversized":
		if err := os.WriteFile(path, append(append([]byte{}, good...), make([]byte, 4096)...), 0o666); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown kind %q", kind)
	}
}

// kindWhy is how the hook names what it found at a region path of size bytes.
func kindWhy(kind string, size int) string {
	switch kind {
	case "fifo":
		return "is a FIFO, not a regular file"
	case "socket":
		return "is a socket, not a regular file"
	case "directory":
		return "is a directory, not a regular file"
	case "symlink":
		return "is a symbolic link, not a regular file"
	case "truncated":
		return fmt.Sprintf("has %d bytes, not %d", size-1, size)
	}
	return fmt.Sprintf("has %d bytes, not %d", size+4096, size)
}

// replacedWhy is how the hook names a usage region that became kind while in use.
func replacedWhy(kind string) string {
	switch kind {
	case "truncated", "oversized":
		return "was replaced by another file while in use"
	case "fifo":
		return "was replaced by a FIFO while in use"
	case "socket":
		return "was replaced by a socket while in use"
	case "directory":
		return "was replaced by a directory while in use"
	}
	return "was replaced by a symbolic link while in use"
}

// TestHostSpecialFilesNeverBlock puts a FIFO, a socket, a directory, a
// symbolic link, a truncated and an oversized file at the quota path and at
// the usage path, before a hooked process starts and while it runs. No
// process blocks (each case has a deadline), each one fails closed for new
// allocations, keeps answering, and says why exactly once.
func TestHostSpecialFilesNeverBlock(t *testing.T) {
	t.Parallel()
	wide := slice{MemoryMiB: wideMiB, ComputePercent: 100}.quota()
	wide.Generation = 1 << 40
	goodQuota, err := region.EncodeQuota(wide)
	if err != nil {
		t.Fatal(err)
	}
	goodUsage := usageImage(t)
	for _, which := range []string{"quota", "usage"} {
		for _, when := range []string{"at start", "while running"} {
			for _, kind := range specialKinds {
				t.Run(fmt.Sprintf("%s/%s/%s", which, when, kind), func(t *testing.T) {
					t.Parallel()
					dev, f := capSlice(t)
					path, good, size := f.Quota, goodQuota, region.QuotaSize
					if which == "usage" {
						path, good, size = f.Usage, goodUsage, region.UsageSize
					}
					why := kindWhy(kind, size)
					if when == "at start" {
						plant(t, path, kind, good)
					}
					p := dev.startAs(f, procOpts{})
					switch {
					case when == "while running":
						if r := p.do(fmt.Sprintf("alloc linear %d", 8*mib)); r.Res != cudaSuccess {
							t.Fatalf("alloc before the change: CUresult %d", r.Res)
						}
						plant(t, path, kind, good)
						if which == "usage" {
							why = replacedWhy(kind)
						}
						if r := p.do(fmt.Sprintf("waitoom %d 2000", mib)); r.Res != cudaOutOfMemory {
							t.Errorf("after the change: CUresult %d after %d us, want out of memory", r.Res, r.Vals[0])
						}
					case which == "usage":
						if r := p.next(30 * time.Second); r.Cmd != "setup" || r.Res != cudaNotPermitted {
							t.Errorf("start with a bad usage region: %+v, want cuInit refused (%d)", r, cudaNotPermitted)
						}
					}
					// Keep the process busy past several polls: the reason must not repeat.
					if r := p.do(fmt.Sprintf("waitalloc %d 100", mib)); r.Res == cudaSuccess {
						t.Errorf("an allocation succeeded with %s at the %s path", kind, which)
					}
					if r := p.do(fmt.Sprintf("fill linear %d", mib)); r.Vals[0] != 0 {
						t.Errorf("%d blocks allocated with %s at the %s path, want none", r.Vals[0], kind, which)
					}
					if r := p.do("meminfo"); r.Cmd != "meminfo" {
						t.Errorf("the process stopped answering: %+v", r)
					}
					p.kill()
					if msg := p.stderr.String(); strings.Count(msg, why) != 1 || !strings.Contains(msg, "failing closed") {
						t.Errorf("stderr does not say %q once with \"failing closed\":\n%s", why, msg)
					}
				})
			}
		}
	}
}

// usageImage is a fresh, initialized usage region image.
func usageImage(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "usage.bin")
	if err := region.CreateUsage(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
