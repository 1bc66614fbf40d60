package region

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Constants of the region ABI; equal to the GPULIMIT_* macros of
// gpulimit_region.h (tested).
const (
	QuotaMagic    uint32 = 0x51425047 // bytes "GPBQ"
	UsageMagic    uint32 = 0x55425047 // bytes "GPBU"
	LayoutVersion uint32 = 1
	SliceIDLen           = 64 // bytes including the terminating NUL
	UUIDBytes            = 16
	UsageSlots           = 64
	UsageDevices         = 4
	QuotaSize            = 128                  // bytes of a quota file
	UsageSize            = 256 + 128*UsageSlots // bytes of a usage file
)

// Errors returned by this package. Callers test them with errors.Is.
var (
	// ErrCorrupt means a file exists but is not a valid region: wrong size,
	// magic, layout version, checksum or a field out of range.
	ErrCorrupt = errors.New("region: corrupt")
	// ErrStaleGeneration means WriteQuota was asked to write a generation that
	// is not higher than the one already in the file.
	ErrStaleGeneration = errors.New("region: generation not higher than current")
	// ErrInvalidQuota means a Quota value is out of range and was not written.
	ErrInvalidQuota = errors.New("region: invalid quota")
	// ErrNotRegular means a region path names a symbolic link, a FIFO, a
	// socket, a device, a directory or anything else that is not a regular
	// file; it is never followed, read or written, and opening it never
	// blocks.
	ErrNotRegular = errors.New("region: not a regular file")
)

// Quota is the content of a slice's quota region. The zero value is not valid.
type Quota struct {
	// Generation orders quota versions; higher wins. Files hold >= 1. In
	// WriteQuota, 0 means "one more than the file's current generation (or
	// 1)".
	Generation uint64
	// SliceID names the slice; at most SliceIDLen-1 bytes, no NUL.
	SliceID string
	// MemoryLimitBytes caps device memory per device for the whole slice,
	// in bytes. 0 makes every allocation fail.
	MemoryLimitBytes uint64
	// ComputePercent is the guaranteed SM share, 1..100.
	ComputePercent uint32
	// ComputeLimitPercent is the burst ceiling, ComputePercent..100.
	ComputeLimitPercent uint32
	// GPUUUID is the slice's GPU in NVML form ("GPU-xxxxxxxx-..."), or ""
	// when not stated. The hook warns about (and still caps) other devices.
	GPUUUID string
}

// quotaRaw mirrors struct gpulimit_quota byte for byte.
type quotaRaw struct {
	Magic               uint32           `c:"magic"`
	LayoutVersion       uint32           `c:"layout_version"`
	Generation          uint64           `c:"generation"`
	SliceID             [SliceIDLen]byte `c:"slice_id"`
	MemoryLimitBytes    uint64           `c:"memory_limit_bytes"`
	ComputePercent      uint32           `c:"compute_percent"`
	ComputeLimitPercent uint32           `c:"compute_limit_percent"`
	GPUUUID             [UUIDBytes]byte  `c:"gpu_uuid"`
	Reserved            [12]byte         `c:"reserved"`
	Checksum            uint32           `c:"checksum"`
}

// Validate reports every problem with q at once; it allows Generation 0.
func (q Quota) Validate() error {
	var errs []error
	if len(q.SliceID) >= SliceIDLen {
		errs = append(errs, fmt.Errorf("slice id is %d bytes, at most %d allowed", len(q.SliceID), SliceIDLen-1))
	}
	if bytes.IndexByte([]byte(q.SliceID), 0) >= 0 {
		errs = append(errs, errors.New("slice id contains NUL"))
	}
	if q.ComputePercent < 1 || q.ComputePercent > 100 {
		errs = append(errs, fmt.Errorf("compute percent must be 1..100, got %d", q.ComputePercent))
	}
	if q.ComputeLimitPercent < q.ComputePercent || q.ComputeLimitPercent > 100 {
		errs = append(errs, fmt.Errorf("compute limit percent must be %d..100, got %d", q.ComputePercent, q.ComputeLimitPercent))
	}
	if q.GPUUUID != "" {
		if _, err := ParseUUID(q.GPUUUID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidQuota, err)
	}
	return nil
}

// EncodeQuota returns the QuotaSize bytes of q's quota region, checksum
// included. q.Generation must be >= 1.
func EncodeQuota(q Quota) ([]byte, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if q.Generation == 0 {
		return nil, fmt.Errorf("%w: generation must be >= 1", ErrInvalidQuota)
	}
	raw := quotaRaw{
		Magic:               QuotaMagic,
		LayoutVersion:       LayoutVersion,
		Generation:          q.Generation,
		MemoryLimitBytes:    q.MemoryLimitBytes,
		ComputePercent:      q.ComputePercent,
		ComputeLimitPercent: q.ComputeLimitPercent,
	}
	copy(raw.SliceID[:], q.SliceID)
	if q.GPUUUID != "" {
		raw.GPUUUID, _ = ParseUUID(q.GPUUUID) // checked by Validate
	}
	var buf bytes.Buffer
	buf.Grow(QuotaSize)
	if err := binary.Write(&buf, binary.LittleEndian, &raw); err != nil {
		return nil, fmt.Errorf("encode quota: %w", err)
	}
	b := buf.Bytes()
	binary.LittleEndian.PutUint32(b[QuotaSize-4:], checksum(b[:QuotaSize-4]))
	return b, nil
}

// DecodeQuota parses a quota region. Any problem yields an error wrapping
// ErrCorrupt; it never panics.
func DecodeQuota(b []byte) (Quota, error) {
	if len(b) != QuotaSize {
		return Quota{}, fmt.Errorf("%w: quota is %d bytes, want %d", ErrCorrupt, len(b), QuotaSize)
	}
	var raw quotaRaw
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, &raw); err != nil {
		return Quota{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	switch {
	case raw.Magic != QuotaMagic:
		return Quota{}, fmt.Errorf("%w: quota magic %#x, want %#x", ErrCorrupt, raw.Magic, QuotaMagic)
	case raw.LayoutVersion != LayoutVersion:
		return Quota{}, fmt.Errorf("%w: quota layout version %d, want %d", ErrCorrupt, raw.LayoutVersion, LayoutVersion)
	case raw.Checksum != checksum(b[:QuotaSize-4]):
		return Quota{}, fmt.Errorf("%w: quota checksum mismatch", ErrCorrupt)
	case raw.Generation == 0:
		return Quota{}, fmt.Errorf("%w: quota generation 0", ErrCorrupt)
	}
	n := bytes.IndexByte(raw.SliceID[:], 0)
	if n < 0 {
		return Quota{}, fmt.Errorf("%w: slice id not NUL-terminated", ErrCorrupt)
	}
	q := Quota{
		Generation:          raw.Generation,
		SliceID:             string(raw.SliceID[:n]),
		MemoryLimitBytes:    raw.MemoryLimitBytes,
		ComputePercent:      raw.ComputePercent,
		ComputeLimitPercent: raw.ComputeLimitPercent,
	}
	if raw.GPUUUID != ([UUIDBytes]byte{}) {
		q.GPUUUID = FormatUUID(raw.GPUUUID)
	}
	if err := q.Validate(); err != nil {
		return Quota{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return q, nil
}

// ReadQuota reads and decodes the quota file at path. A missing file yields
// an error wrapping fs.ErrNotExist; anything but a regular file one wrapping
// ErrNotRegular (never blocking); a file of another size or content one
// wrapping ErrCorrupt.
func ReadQuota(path string) (Quota, error) {
	b, err := readExact(path, QuotaSize)
	if err != nil {
		return Quota{}, fmt.Errorf("read quota: %w", err)
	}
	q, err := DecodeQuota(b)
	if err != nil {
		return Quota{}, fmt.Errorf("read quota %s: %w", path, err)
	}
	return q, nil
}

// WriteQuota atomically replaces the quota file at path with q: it writes a
// temporary file in the same directory, syncs it and renames it over path,
// so a concurrent reader sees either the old or the new file, never a mix.
// The written generation is q.Generation, or, if that is 0, one more than
// the current file's (1 when there is no valid file). A q.Generation not
// higher than a valid current file's yields ErrStaleGeneration. WriteQuota
// is not safe for concurrent use on the same path; the agent is the only
// writer.
func WriteQuota(path string, q Quota) error {
	cur, err := ReadQuota(path)
	switch {
	case err == nil:
		if q.Generation == 0 {
			q.Generation = cur.Generation + 1
		} else if q.Generation <= cur.Generation {
			return fmt.Errorf("write quota %s: generation %d, current %d: %w", path, q.Generation, cur.Generation, ErrStaleGeneration)
		}
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, ErrCorrupt), errors.Is(err, ErrNotRegular):
		// Nothing valid to continue from: whatever is at path (a FIFO or a
		// symbolic link included) is replaced by the rename, never opened.
		if q.Generation == 0 {
			q.Generation = 1
		}
	default:
		return fmt.Errorf("write quota: %w", err)
	}
	b, err := EncodeQuota(q)
	if err != nil {
		return fmt.Errorf("write quota %s: %w", path, err)
	}
	if err := replaceFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write quota: %w", err)
	}
	return nil
}

func checksum(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b) // hash.Hash.Write never fails
	return h.Sum32()
}

// openRegular opens path with flag and returns it only if it is a regular
// file of exactly size bytes (size < 0: any size). It never follows a
// symbolic link in the last component (O_NOFOLLOW), never blocks on a FIFO
// or device (O_NONBLOCK; lstat first, so a FIFO, socket or device is not
// even opened), and never lets the file become a controlling terminal.
// Region files may be tampered with by whoever can write their directory,
// and the agent that reads and writes them runs as root: a planted link or
// FIFO must not redirect or block it.
func openRegular(path string, flag int, size int64) (*os.File, error) {
	pre, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !pre.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w: it is %s", path, ErrNotRegular, fileKind(pre.Mode()))
	}
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	switch {
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("%s: %w: it is a symbolic link", path, ErrNotRegular)
	case errors.Is(err, syscall.ENXIO):
		return nil, fmt.Errorf("%s: %w: it is a FIFO or socket", path, ErrNotRegular)
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w: it is %s", path, ErrNotRegular, fileKind(st.Mode()))
	}
	if size >= 0 && st.Size() != size {
		f.Close()
		return nil, fmt.Errorf("%w: %s has %d bytes, want %d", ErrCorrupt, path, st.Size(), size)
	}
	return f, nil
}

// fileKind names the type of a file mode for messages.
func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// readExact reads the regular file at path, which must have exactly size bytes.
func readExact(path string, size int64) ([]byte, error) {
	f, err := openRegular(path, os.O_RDONLY, size)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// replaceFile writes b to a temporary file next to path and renames it over path.
func replaceFile(path string, b []byte, perm os.FileMode) (rerr error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp in %s: %w", dir, err)
	}
	defer func() {
		if rerr != nil {
			_ = os.Remove(tmp.Name()) // best effort; the error that matters is rerr
		}
	}()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp.Name(), err)
	}
	return nil
}
