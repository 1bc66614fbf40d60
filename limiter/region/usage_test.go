package region

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// encodeUsage builds a usage region image the way hooks would write it.
func encodeUsage(t testing.TB, raw usageRaw) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, &raw); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sampleUsageRaw() usageRaw {
	var raw usageRaw
	raw.Header.Magic = UsageMagic
	raw.Header.LayoutVersion = LayoutVersion
	raw.Header.SlotCount = UsageSlots
	raw.Header.DeviceCount = UsageDevices
	raw.Header.PaceTargetPermille = 250
	raw.Header.PaceSMCount = 132
	raw.Slots[3] = usageSlotRaw{PID: 42, StartTime: 7, LastLaunchNs: 1_700_000_000_000_000_000, LaunchCount: 9}
	raw.Slots[3].Devices[0] = usageDeviceRaw{UUID: [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, BytesInUse: 1 << 20}
	raw.Slots[5] = usageSlotRaw{PID: 43}
	raw.Slots[5].Devices[2] = usageDeviceRaw{UUID: [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, BytesInUse: 3 << 20}
	return raw
}

func TestDecodeUsage(t *testing.T) {
	const uuid = "GPU-deadbeef-0102-0304-0506-0708090a0b0c"
	got, err := DecodeUsage(encodeUsage(t, sampleUsageRaw()))
	if err != nil {
		t.Fatalf("DecodeUsage: %v", err)
	}
	want := Usage{
		Processes: []ProcessUsage{
			{Slot: 3, PID: 42, StartTimeTicks: 7, LastLaunch: time.Unix(0, 1_700_000_000_000_000_000).UTC(), LaunchCount: 9,
				Devices: []DeviceUsage{{UUID: uuid, BytesInUse: 1 << 20}}},
			{Slot: 5, PID: 43, Devices: []DeviceUsage{{UUID: uuid, BytesInUse: 3 << 20}}},
		},
		Pace: Pace{TargetPermille: 250, SMCount: 132},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DecodeUsage (-want +got):\n%s", diff)
	}
	if sum := got.BytesInUse(uuid); sum != 4<<20 {
		t.Errorf("BytesInUse = %d, want %d", sum, 4<<20)
	}
}

func TestDecodeUsageRejectsCorrupt(t *testing.T) {
	tests := []struct {
		name string
		f    func(r *usageRaw)
	}{
		{name: "wrong magic", f: func(r *usageRaw) { r.Header.Magic = QuotaMagic }},
		{name: "future layout", f: func(r *usageRaw) { r.Header.LayoutVersion = 2 }},
		{name: "other slot count", f: func(r *usageRaw) { r.Header.SlotCount = 32 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := sampleUsageRaw()
			tc.f(&raw)
			if _, err := DecodeUsage(encodeUsage(t, raw)); !errors.Is(err, ErrCorrupt) {
				t.Errorf("DecodeUsage error = %v, want ErrCorrupt", err)
			}
		})
	}
	if _, err := DecodeUsage(make([]byte, UsageSize-1)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("short region: error = %v, want ErrCorrupt", err)
	}
}

// TestCreateUsageInitializesAndKeepsExisting: a new usage file has an
// initialized header (the hook refuses an uninitialized one) and mode 0666
// whatever the umask; an existing one is never replaced.
func TestCreateUsageInitializesAndKeepsExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.bin")
	old := syscall.Umask(0o077)
	err := CreateUsage(path)
	syscall.Umask(old)
	if err != nil {
		t.Fatalf("CreateUsage: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != UsageMode || st.Size() != UsageSize {
		t.Fatalf("fresh usage file %v, %v; want mode %v and %d bytes", st.Mode(), err, UsageMode, UsageSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if m, v := binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:]); m != UsageMagic || v != LayoutVersion {
		t.Errorf("fresh header magic %#x version %d, want %#x %d", m, v, UsageMagic, LayoutVersion)
	}
	u, err := ReadUsage(path)
	if err != nil || len(u.Processes) != 0 {
		t.Fatalf("fresh usage = %+v, %v; want empty", u, err)
	}
	img := encodeUsage(t, sampleUsageRaw())
	if err := os.WriteFile(path, img, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := CreateUsage(path); err != nil {
		t.Fatalf("CreateUsage on existing: %v", err)
	}
	after, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(after, img) {
		t.Errorf("CreateUsage changed an existing file (err %v)", err)
	}
}

func TestUUIDRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{name: "nvml form", in: "GPU-deadbeef-0102-0304-0506-0708090a0b0c"},
		{name: "uppercase hex accepted", in: "GPU-DEADBEEF-0102-0304-0506-0708090A0B0C"},
		{name: "mig instance form accepted, formatted back as GPU-", in: "MIG-deadbeef-0102-0304-0506-0708090a0b0c"},
		{name: "other prefix rejected", in: "GPX-deadbeef-0102-0304-0506-0708090a0b0c", wantErr: true},
		{name: "bad digit", in: "GPU-deadbeeg-0102-0304-0506-0708090a0b0c", wantErr: true},
		{name: "misplaced dash", in: "GPU-deadbee-f0102-0304-0506-0708090a0b0c", wantErr: true},
		{name: "short", in: "GPU-", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseUUID(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseUUID error = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil {
				if got := FormatUUID(b); got != "GPU-deadbeef-0102-0304-0506-0708090a0b0c" {
					t.Errorf("FormatUUID = %q", got)
				}
			}
		})
	}
}

func FuzzDecodeUsage(f *testing.F) {
	f.Add(encodeUsage(f, sampleUsageRaw()))
	f.Add(make([]byte, UsageSize))
	f.Add([]byte("GPBU"))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := DecodeUsage(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		for _, p := range u.Processes {
			if p.PID == 0 || p.Slot < 0 || p.Slot >= UsageSlots || len(p.Devices) > UsageDevices {
				t.Fatalf("impossible process entry %+v", p)
			}
		}
	})
}

func TestWriteAgentSample(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.bin")
	if err := os.WriteFile(path, encodeUsage(t, sampleUsageRaw()), 0o666); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_800_000_000, 123).UTC()
	if err := WriteAgentSample(path, AgentSample{Time: at, SliceUtilPermille: 250, DeviceUtilPermille: 1200}); err != nil {
		t.Fatalf("WriteAgentSample: %v", err)
	}
	u, err := ReadUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	want := AgentSample{Time: at, SliceUtilPermille: 250, DeviceUtilPermille: 1000}
	if diff := cmp.Diff(want, u.Agent); diff != "" {
		t.Errorf("agent sample (-want +got):\n%s", diff)
	}
	if len(u.Processes) != 2 {
		t.Errorf("WriteAgentSample disturbed the slots: %+v", u.Processes)
	}
	if err := WriteAgentSample(filepath.Join(t.TempDir(), "absent"), want); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error = %v, want fs.ErrNotExist", err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := WriteAgentSample(short, want); !errors.Is(err, ErrCorrupt) {
		t.Errorf("short file: error = %v, want ErrCorrupt", err)
	}
}
