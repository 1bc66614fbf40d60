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
	// ErrNotRegular means a region path names a symbolic link, a FIFO or
	// anything else that is not a regular file; it is never followed or read.
	ErrNotRegular = errors.New("region: not a regular file")
)

// Quota is the content of a slice's quota region. The zero value is not valid.
type Quota struct {
	// Generation orders quota versions; higher wins. Files hold >= 1; the
	// pod environment counts as generation 0. In WriteQuota, 0 means "one
	// more than the file's current generation (or 1)".
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
	Reserved            [28]byte         `c:"reserved"`
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
	if err := q.Validate(); err != nil {
		return Quota{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return q, nil
}

// ReadQuota reads and decodes the quota file at path. A missing file yields
// an error wrapping fs.ErrNotExist; a bad one an error wrapping ErrCorrupt.
func ReadQuota(path string) (Quota, error) {
	b, err := readLimited(path, QuotaSize+1)
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
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, ErrCorrupt):
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

// openRegular opens path with flag, refusing to follow a symbolic link in its
// last component and anything but a regular file. Usage files live in a
// directory the tenant can write, and the agent that reads and writes them
// runs as root: a planted link or FIFO must not redirect or block it.
// O_NONBLOCK keeps a FIFO from blocking the open; it changes nothing for
// regular files.
func openRegular(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("%s: %w: it is a symbolic link", path, ErrNotRegular)
	case errors.Is(err, syscall.ENXIO):
		return nil, fmt.Errorf("%s: %w: it is a FIFO or device without a peer", path, ErrNotRegular)
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
		return nil, fmt.Errorf("%s: %w: mode %s", path, ErrNotRegular, st.Mode().Type())
	}
	return f, nil
}

// readLimited reads at most max bytes of the regular file at path.
func readLimited(path string, max int64) ([]byte, error) {
	f, err := openRegular(path, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, max)); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf.Bytes(), nil
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
