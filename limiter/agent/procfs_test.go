package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	testUID = "0b5c4e1a-3f2d-4c8b-9a7e-1d2c3b4a5f60"
	testCID = "5f2e1c0a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
)

func TestParseCgroup(t *testing.T) {
	usc := "0b5c4e1a_3f2d_4c8b_9a7e_1d2c3b4a5f60"
	tests := []struct {
		name    string
		in      string
		wantPod string
		wantCID string
	}{
		{name: "v2 systemd driver containerd", in: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + usc + ".slice/cri-containerd-" + testCID + ".scope\n",
			wantPod: testUID, wantCID: testCID},
		{name: "v2 cgroupfs driver", in: "0::/kubepods/besteffort/pod" + testUID + "/" + testCID + "\n", wantPod: testUID, wantCID: testCID},
		{name: "v2 guaranteed qos systemd", in: "0::/kubepods.slice/kubepods-pod" + usc + ".slice/crio-" + testCID + ".scope\n", wantPod: testUID, wantCID: testCID},
		{name: "v2 nested under kubelet.slice (kind)", in: "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + usc + ".slice/cri-containerd-" + testCID + ".scope\n",
			wantPod: testUID, wantCID: testCID},
		{name: "v1 many hierarchies docker", in: "12:pids:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n11:memory:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n1:name=systemd:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n",
			wantPod: testUID, wantCID: testCID},
		{name: "v1 systemd driver docker scope", in: "4:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + usc + ".slice/docker-" + testCID + ".scope\n",
			wantPod: testUID, wantCID: testCID},
		{name: "pod sandbox cgroup without container", in: "0::/kubepods/burstable/pod" + testUID + "\n", wantPod: testUID},
		{name: "host process", in: "0::/system.slice/nvidia-persistenced.service\n"},
		{name: "user session", in: "0::/user.slice/user-1000.slice/session-3.scope\n"},
		{name: "garbage", in: "not a cgroup file"},
		{name: "empty", in: ""},
		{name: "pod-like name outside kubepods", in: "0::/system.slice/pod" + testUID + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod, cid := ParseCgroup([]byte(tc.in))
			if diff := cmp.Diff([2]string{tc.wantPod, tc.wantCID}, [2]string{pod, cid}); diff != "" {
				t.Errorf("ParseCgroup (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseStartTime(t *testing.T) {
	tail := " S 1 100 100 0 -1 4194560 1000 0 0 0 10 5 0 0 20 0 4 0 123456789 1000000 200 18446744073709551615"
	tests := []struct {
		name    string
		in      string
		want    uint64
		wantErr bool
	}{
		{name: "plain command", in: "4242 (python3)" + tail, want: 123456789},
		{name: "command with spaces and parens", in: "4242 (my (weird) prog)" + tail, want: 123456789},
		{name: "truncated", in: "4242 (python3) S 1 2 3", wantErr: true},
		{name: "no command", in: "4242 python3", wantErr: true},
		{name: "not a number", in: "4242 (p) S 1 100 100 0 -1 4194560 1000 0 0 0 10 5 0 0 20 0 4 0 x 1", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStartTime([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("start time %d, want %d", got, tc.want)
			}
		})
	}
}

// fakeProc is a proc(5) tree in a temporary directory.
type fakeProc struct {
	t    testing.TB
	root string
}

func newFakeProc(t testing.TB) *fakeProc {
	t.Helper()
	return &fakeProc{t: t, root: t.TempDir()}
}

// add creates /proc/<pid> with a cgroup file in the given pod (uid "" for
// a host process), an NSpid line and a start time.
func (f *fakeProc) add(pid, nspid uint32, start uint64, podUID, cid string) {
	f.t.Helper()
	dir := filepath.Join(f.root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	cg := "0::/system.slice/something.service\n"
	if podUID != "" {
		cg = "0::/kubepods/burstable/pod" + podUID + "/" + cid + "\n"
	}
	stat := fmt.Sprintf("%d (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0", pid, start)
	status := fmt.Sprintf("Name:\tpython3\nPid:\t%d\nNSpid:\t%d\t%d\n", pid, pid, nspid)
	for name, body := range map[string]string{"cgroup": cg, "stat": stat, "status": status} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

func TestProcFSProcess(t *testing.T) {
	f := newFakeProc(t)
	f.add(100, 7, 5555, testUID, testCID)
	f.add(200, 200, 6666, "", "")
	p := ProcFS{Root: f.root}
	tests := []struct {
		name    string
		pid     uint32
		want    Process
		wantErr error
	}{
		{name: "pod process in its own pid namespace", pid: 100,
			want: Process{PID: 100, PodUID: testUID, ContainerID: testCID, NSPid: 7, StartTimeTicks: 5555}},
		{name: "host process", pid: 200, want: Process{PID: 200, NSPid: 200, StartTimeTicks: 6666}},
		{name: "exited process", pid: 300, want: Process{PID: 300, NSPid: 300}, wantErr: ErrNoProcess},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Process(tc.pid)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Process (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseCgroup(f *testing.F) {
	f.Add([]byte("0::/kubepods/burstable/pod" + testUID + "/" + testCID + "\n"))
	f.Add([]byte("12:memory:/kubepods.slice/kubepods-pod0b5c4e1a_3f2d_4c8b_9a7e_1d2c3b4a5f60.slice/docker-" + testCID + ".scope\n"))
	f.Add([]byte("::::\n:\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pod, cid := ParseCgroup(b)
		if pod != "" && len(pod) != 36 {
			t.Errorf("pod uid %q is not a uuid", pod)
		}
		if cid != "" && pod == "" {
			t.Errorf("container %q without a pod", cid)
		}
	})
}

func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte("1 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0"))
	f.Add([]byte("1 (a) b) S"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseStartTime(b) // must not panic
	})
}
