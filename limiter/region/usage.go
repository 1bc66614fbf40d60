package region

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// usageHeaderRaw mirrors the first 256 bytes of struct gpulimit_usage.
type usageHeaderRaw struct {
	Magic                   uint32   `c:"magic"`
	LayoutVersion           uint32   `c:"layout_version"`
	SlotCount               uint32   `c:"slot_count"`
	DeviceCount             uint32   `c:"device_count"`
	AgentSampleNs           uint64   `c:"agent_sample_ns"`
	AgentUtilPermille       uint32   `c:"agent_util_permille"`
	AgentDeviceUtilPermille uint32   `c:"agent_device_util_permille"`
	Reserved0               [32]byte `c:"reserved0"`
	PaceTokensQ10           int64    `c:"pace_tokens_q10"`
	PaceRefillNs            uint64   `c:"pace_refill_ns"`
	PaceRateQ10PerMs        uint64   `c:"pace_rate_q10_per_ms"`
	PaceBlocksTotal         uint64   `c:"pace_blocks_total"`
	PaceWaitNsTotal         uint64   `c:"pace_wait_ns_total"`
	PaceNextControlNs       uint64   `c:"pace_next_control_ns"`
	PaceTargetPermille      uint32   `c:"pace_target_permille"`
	PaceUtilPermille        uint32   `c:"pace_util_permille"`
	PaceDeviceUtilPermille  uint32   `c:"pace_device_util_permille"`
	PaceSMCount             uint32   `c:"pace_sm_count"`
	CtlBlocksPrev           uint64   `c:"ctl_blocks_prev"`
	CtlWaitNsPrev           uint64   `c:"ctl_wait_ns_prev"`
	CtlRunNsPrev            uint64   `c:"ctl_run_ns_prev"`
	CtlNvmlSeenUs           uint64   `c:"ctl_nvml_seen_us"`
	CtlAgentSeenNs          uint64   `c:"ctl_agent_seen_ns"`
	Reserved1               [88]byte `c:"reserved1"`
}

// usageDeviceRaw mirrors struct gpulimit_usage_device.
type usageDeviceRaw struct {
	UUID       [UUIDBytes]byte `c:"uuid"`
	BytesInUse uint64          `c:"bytes_in_use"`
}

// usageSlotRaw mirrors struct gpulimit_usage_slot.
type usageSlotRaw struct {
	PID          uint32                       `c:"pid"`
	Reserved0    uint32                       `c:"reserved0"`
	StartTime    uint64                       `c:"start_time"`
	LastLaunchNs uint64                       `c:"last_launch_ns"`
	LaunchCount  uint64                       `c:"launch_count"`
	Devices      [UsageDevices]usageDeviceRaw `c:"devices"`
}

// usageRaw mirrors struct gpulimit_usage.
type usageRaw struct {
	Header usageHeaderRaw
	Slots  [UsageSlots]usageSlotRaw `c:"slots"`
}

// Usage is a snapshot of a slice's usage region.
type Usage struct {
	// Processes holds the claimed slots (pid != 0) in slot order. Some may
	// belong to processes that have exited; see package doc.
	Processes []ProcessUsage
	// Pace is the slice-wide compute pacing state.
	Pace Pace
	// Agent is the agent's latest utilization sample; zero if none.
	Agent AgentSample
}

// AgentSample is the node agent's measurement of a slice's SM use, which it
// writes into the usage region for the hooks (WriteAgentSample). The agent
// sees host pids, so its view works where the hook's own NVML query cannot
// match pids (inside a pid namespace).
type AgentSample struct {
	// Time is when the agent measured; hooks ignore samples older than 500 ms.
	Time time.Time
	// SliceUtilPermille is the slice's SM use in per mille of the device, 0..1000.
	SliceUtilPermille uint32
	// DeviceUtilPermille is the device's SM use (all processes), per mille, 0..1000.
	DeviceUtilPermille uint32
}

// ProcessUsage is one claimed slot of the usage region.
type ProcessUsage struct {
	Slot int    // index in the region, 0..UsageSlots-1
	PID  uint32 // in the pod's pid namespace
	// StartTimeTicks is the process start time in clock ticks after boot
	// (proc(5) stat field 22), used to tell a reused pid from the owner.
	StartTimeTicks uint64
	// LastLaunch is the time of the last kernel launch; zero if none.
	LastLaunch  time.Time
	LaunchCount uint64
	// Devices lists the devices with an entry, in slot order.
	Devices []DeviceUsage
}

// DeviceUsage is one process's use of one device.
type DeviceUsage struct {
	UUID       string // NVML form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	BytesInUse uint64 // bytes charged by the hook
}

// Pace is the slice-wide compute pacing state written by the hooks.
type Pace struct {
	TargetPermille     uint32        // effective SM share target, per mille of the device
	UtilPermille       uint32        // last measured SM share of the slice, per mille
	DeviceUtilPermille uint32        // last measured SM use of the device, per mille
	SMCount            uint32        // SMs of the device; 0 = not measured yet
	BlocksTotal        uint64        // thread blocks launched by the slice
	Wait               time.Duration // total time the slice's launches waited for tokens
}

// BytesInUse sums the bytes charged on the device with the given NVML UUID
// over every process in u, dead or alive.
func (u Usage) BytesInUse(uuid string) uint64 {
	var sum uint64
	for _, p := range u.Processes {
		for _, d := range p.Devices {
			if d.UUID == uuid {
				sum += d.BytesInUse
			}
		}
	}
	return sum
}

// DecodeUsage parses a usage region. An all-zero region (created but not yet
// initialized by a hook) yields an empty Usage. Any problem yields an error
// wrapping ErrCorrupt; it never panics.
func DecodeUsage(b []byte) (Usage, error) {
	if len(b) != UsageSize {
		return Usage{}, fmt.Errorf("%w: usage is %d bytes, want %d", ErrCorrupt, len(b), UsageSize)
	}
	var raw usageRaw
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, &raw); err != nil {
		return Usage{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	h := raw.Header
	if h.Magic == 0 {
		return Usage{}, nil
	}
	switch {
	case h.Magic != UsageMagic:
		return Usage{}, fmt.Errorf("%w: usage magic %#x, want %#x", ErrCorrupt, h.Magic, UsageMagic)
	case h.LayoutVersion != LayoutVersion:
		return Usage{}, fmt.Errorf("%w: usage layout version %d, want %d", ErrCorrupt, h.LayoutVersion, LayoutVersion)
	case h.SlotCount != UsageSlots || h.DeviceCount != UsageDevices:
		return Usage{}, fmt.Errorf("%w: usage has %d slots of %d devices, want %d of %d", ErrCorrupt, h.SlotCount, h.DeviceCount, UsageSlots, UsageDevices)
	}
	u := Usage{Pace: Pace{
		TargetPermille:     h.PaceTargetPermille,
		UtilPermille:       h.PaceUtilPermille,
		DeviceUtilPermille: h.PaceDeviceUtilPermille,
		SMCount:            h.PaceSMCount,
		BlocksTotal:        h.PaceBlocksTotal,
		Wait:               time.Duration(min(h.PaceWaitNsTotal, uint64(1<<63-1))),
	}}
	if h.AgentSampleNs != 0 && h.AgentSampleNs <= 1<<63-1 {
		u.Agent = AgentSample{
			Time:               time.Unix(0, int64(h.AgentSampleNs)).UTC(),
			SliceUtilPermille:  h.AgentUtilPermille,
			DeviceUtilPermille: h.AgentDeviceUtilPermille,
		}
	}
	for i, s := range raw.Slots {
		if s.PID == 0 {
			continue
		}
		p := ProcessUsage{Slot: i, PID: s.PID, StartTimeTicks: s.StartTime, LaunchCount: s.LaunchCount}
		if s.LastLaunchNs != 0 && s.LastLaunchNs <= 1<<63-1 {
			p.LastLaunch = time.Unix(0, int64(s.LastLaunchNs)).UTC()
		}
		for _, d := range s.Devices {
			if d.UUID == ([UUIDBytes]byte{}) {
				continue
			}
			p.Devices = append(p.Devices, DeviceUsage{UUID: FormatUUID(d.UUID), BytesInUse: d.BytesInUse})
		}
		u.Processes = append(u.Processes, p)
	}
	return u, nil
}

// ReadUsage reads and decodes the usage file at path. The file is read with
// plain reads while hooks may be writing it; every field is read once, so a
// snapshot can mix old and new values of different slots but never a torn
// 8-byte field (aligned 8-byte stores are atomic on supported hosts). Like
// ReadQuota it never follows a symbolic link or blocks: anything but a
// regular file of UsageSize bytes is an error wrapping ErrNotRegular or
// ErrCorrupt.
func ReadUsage(path string) (Usage, error) {
	b, err := readExact(path, UsageSize)
	if err != nil {
		return Usage{}, fmt.Errorf("read usage: %w", err)
	}
	u, err := DecodeUsage(b)
	if err != nil {
		return Usage{}, fmt.Errorf("read usage %s: %w", path, err)
	}
	return u, nil
}

// UsageMode is the mode of a usage file: every hooked process of the slice
// maps it read-write, whatever its uid. Its directory is 0755 and root's, so
// only root can delete, rename or replace the file (ARCHITECTURE.md "Usage
// region").
const UsageMode os.FileMode = 0o666

// CreateUsage creates the usage file at path, initialized (header set, no
// process), with mode UsageMode whatever the umask, if nothing is there. It
// never follows a symbolic link (O_EXCL). An existing regular file of
// UsageSize bytes is left as it is, because hooks may have it mapped:
// replacing it would split the slice's accounting between two files. Anything
// else at path is an error wrapping ErrNotRegular or ErrCorrupt, and is left
// for the caller to report: hooks refuse it and fail closed.
func CreateUsage(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, UsageMode)
	if errors.Is(err, fs.ErrExist) {
		g, err := openRegular(path, os.O_RDONLY, UsageSize)
		if err != nil {
			return fmt.Errorf("create usage: %w", err)
		}
		return g.Close()
	}
	if err != nil {
		return fmt.Errorf("create usage: %w", err)
	}
	img := make([]byte, UsageSize)
	binary.LittleEndian.PutUint32(img[0:], UsageMagic)
	binary.LittleEndian.PutUint32(img[4:], LayoutVersion)
	binary.LittleEndian.PutUint32(img[8:], UsageSlots)
	binary.LittleEndian.PutUint32(img[12:], UsageDevices)
	_, err = f.Write(img)
	if err == nil {
		err = f.Chmod(UsageMode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path) // a half-written region would be refused by every hook; the next call retries
		return fmt.Errorf("create usage %s: %w", path, err)
	}
	return nil
}

// FormatUUID formats a binary device UUID the way NVML prints it:
// "GPU-" followed by 8-4-4-4-12 lowercase hex digits.
func FormatUUID(b [UUIDBytes]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ParseUUID parses NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" form,
// or a MIG instance's "MIG-…" of the same shape (the bytes CUDA reports for
// the MIG device, which the hook compares). The bytes do not say which it
// was: FormatUUID gives the GPU- form back.
func ParseUUID(s string) ([UUIDBytes]byte, error) {
	var out [UUIDBytes]byte
	const want = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	if len(s) != len(want) || (s[:4] != "GPU-" && s[:4] != "MIG-") {
		return out, fmt.Errorf("parse uuid %q: want form %s (or MIG-… for a MIG instance)", s, want)
	}
	n := 0
	for i := 4; i < len(s); i++ {
		if want[i] == '-' {
			if s[i] != '-' {
				return out, fmt.Errorf("parse uuid %q: want '-' at %d", s, i)
			}
			continue
		}
		v, ok := hexVal(s[i])
		if !ok {
			return out, fmt.Errorf("parse uuid %q: bad hex digit at %d", s, i)
		}
		if n%2 == 0 {
			out[n/2] = v << 4
		} else {
			out[n/2] |= v
		}
		n++
	}
	return out, nil
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Offsets of the agent's fields in the usage region (gpulimit_region.h; tested).
const (
	agentSampleOffset = 16
	agentUtilOffset   = 24
)

// WriteAgentSample publishes the agent's measurement of a slice's SM use into
// its usage file at path, in place (hooks have the file mapped): first the
// two utilizations in one 8-byte write, then the time stamp, so a hook that
// reads the stamp before and after the values never mixes two samples'
// stamps. Utilizations above 1000 are clamped. The file must exist with
// UsageSize bytes (CreateUsage); a missing file yields an error wrapping
// fs.ErrNotExist; anything but a regular file of UsageSize bytes is refused
// (ErrNotRegular, ErrCorrupt) without blocking. Not safe for concurrent use
// on the same path.
func WriteAgentSample(path string, s AgentSample) error {
	f, err := openRegular(path, os.O_WRONLY, UsageSize)
	if err != nil {
		return fmt.Errorf("write agent sample: %w", err)
	}
	defer f.Close()
	var util [8]byte
	binary.LittleEndian.PutUint32(util[0:], min(s.SliceUtilPermille, 1000))
	binary.LittleEndian.PutUint32(util[4:], min(s.DeviceUtilPermille, 1000))
	if _, err := f.WriteAt(util[:], agentUtilOffset); err != nil {
		return fmt.Errorf("write agent sample %s: %w", path, err)
	}
	var stamp [8]byte
	binary.LittleEndian.PutUint64(stamp[:], uint64(s.Time.UnixNano()))
	if _, err := f.WriteAt(stamp[:], agentSampleOffset); err != nil {
		return fmt.Errorf("write agent sample %s: %w", path, err)
	}
	return nil
}
