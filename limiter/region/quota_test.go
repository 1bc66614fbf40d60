package region

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func validQuota() Quota {
	return Quota{Generation: 3, SliceID: "slice-a", MemoryLimitBytes: 8 << 30, ComputePercent: 25, ComputeLimitPercent: 50}
}

func TestQuotaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		q    Quota
	}{
		{name: "typical slice", q: validQuota()},
		{name: "longest slice id", q: Quota{Generation: 1, SliceID: "x123456789012345678901234567890123456789012345678901234567890ab", MemoryLimitBytes: 1, ComputePercent: 1, ComputeLimitPercent: 1}},
		{name: "zero memory refuses all", q: Quota{Generation: 1 << 62, SliceID: "s", ComputePercent: 100, ComputeLimitPercent: 100}},
		{name: "with the slice's GPU", q: Quota{Generation: 2, SliceID: "s", MemoryLimitBytes: 1 << 30, ComputePercent: 10, ComputeLimitPercent: 20,
			GPUUUID: "GPU-5bd3a1e2-7c4f-4e8a-9b1d-2f6e8c0a4d17"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeQuota(tc.q)
			if err != nil {
				t.Fatalf("EncodeQuota: %v", err)
			}
			if len(b) != QuotaSize {
				t.Fatalf("encoded %d bytes, want %d", len(b), QuotaSize)
			}
			got, err := DecodeQuota(b)
			if err != nil {
				t.Fatalf("DecodeQuota: %v", err)
			}
			if diff := cmp.Diff(tc.q, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeQuotaRejectsCorrupt(t *testing.T) {
	good, err := EncodeQuota(validQuota())
	if err != nil {
		t.Fatal(err)
	}
	// mutate returns a copy of good changed by f, re-checksummed when fix is set.
	mutate := func(fix bool, f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		if fix {
			binary.LittleEndian.PutUint32(b[QuotaSize-4:], checksum(b[:QuotaSize-4]))
		}
		return b
	}
	tests := []struct {
		name string
		b    []byte
	}{
		{name: "empty file", b: nil},
		{name: "truncated", b: good[:QuotaSize-1]},
		{name: "trailing bytes", b: append(append([]byte(nil), good...), 0)},
		{name: "wrong magic", b: mutate(true, func(b []byte) { b[0] ^= 1 })},
		{name: "future layout version", b: mutate(true, func(b []byte) { b[4] = 2 })},
		{name: "flipped bit without checksum fix", b: mutate(false, func(b []byte) { b[80] ^= 0x10 })},
		{name: "generation zero", b: mutate(true, func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 0) })},
		{name: "slice id without NUL", b: mutate(true, func(b []byte) {
			for i := 16; i < 80; i++ {
				b[i] = 'a'
			}
		})},
		{name: "compute percent zero", b: mutate(true, func(b []byte) { binary.LittleEndian.PutUint32(b[88:], 0) })},
		{name: "compute limit below guarantee", b: mutate(true, func(b []byte) { binary.LittleEndian.PutUint32(b[92:], 10) })},
		{name: "compute limit above 100", b: mutate(true, func(b []byte) { binary.LittleEndian.PutUint32(b[92:], 101) })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeQuota(tc.b)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("DecodeQuota error = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestWriteQuotaGenerations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.bin")
	q := validQuota()
	q.Generation = 0
	steps := []struct {
		name    string
		gen     uint64
		wantGen uint64
		wantErr error
	}{
		{name: "first write without generation gets 1", gen: 0, wantGen: 1},
		{name: "next write without generation increments", gen: 0, wantGen: 2},
		{name: "explicit higher generation", gen: 10, wantGen: 10},
		{name: "equal generation is stale", gen: 10, wantGen: 10, wantErr: ErrStaleGeneration},
		{name: "lower generation is stale", gen: 5, wantGen: 10, wantErr: ErrStaleGeneration},
	}
	for _, s := range steps {
		q.Generation = s.gen
		err := WriteQuota(path, q)
		if !errors.Is(err, s.wantErr) {
			t.Fatalf("%s: WriteQuota error = %v, want %v", s.name, err, s.wantErr)
		}
		got, err := ReadQuota(path)
		if err != nil {
			t.Fatalf("%s: ReadQuota: %v", s.name, err)
		}
		if got.Generation != s.wantGen {
			t.Fatalf("%s: generation = %d, want %d", s.name, got.Generation, s.wantGen)
		}
	}
	left, err := filepath.Glob(filepath.Join(filepath.Dir(path), ".quota.bin.tmp-*"))
	if err != nil || len(left) != 0 {
		t.Errorf("temporary files left behind: %v (err %v)", left, err)
	}
}

func TestWriteQuotaReplacesCorruptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.bin")
	if err := os.WriteFile(path, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadQuota(path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadQuota of garbage = %v, want ErrCorrupt", err)
	}
	q := validQuota()
	q.Generation = 0
	if err := WriteQuota(path, q); err != nil {
		t.Fatalf("WriteQuota over corrupt file: %v", err)
	}
	got, err := ReadQuota(path)
	if err != nil || got.Generation != 1 {
		t.Fatalf("ReadQuota = %+v, %v; want generation 1", got, err)
	}
}

func TestReadQuotaMissing(t *testing.T) {
	_, err := ReadQuota(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadQuota error = %v, want fs.ErrNotExist", err)
	}
}

func TestWriteQuotaRejectsInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.bin")
	q := validQuota()
	q.ComputeLimitPercent = 101
	if err := WriteQuota(path, q); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("WriteQuota error = %v, want ErrInvalidQuota", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("invalid quota left a file: %v", err)
	}
}

func FuzzDecodeQuota(f *testing.F) {
	good, err := EncodeQuota(validQuota())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:64])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := DecodeQuota(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// A decoded quota re-encodes to the same bytes except reserved ones.
		again, err := EncodeQuota(q)
		if err != nil {
			t.Fatalf("decoded quota %+v does not encode: %v", q, err)
		}
		back, err := DecodeQuota(again)
		if err != nil || back != q {
			t.Fatalf("re-decode = %+v, %v; want %+v", back, err, q)
		}
	})
}
