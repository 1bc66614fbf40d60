package proxy

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestScrubberRemovesTheSecretAcrossReads feeds the secret in every split
// over one-byte reads, next to near misses that must stay.
func TestScrubberRemovesTheSecretAcrossReads(t *testing.T) {
	const secret = "S3CRETTOKEN"
	tests := []struct{ in, want string }{
		{"", ""},
		{"no secret here", "no secret here"},
		{"a" + secret + "b", "ab"},
		{secret + secret, ""},
		{"S3CRET S3CRETTOKE " + secret, "S3CRET S3CRETTOKE "},
		{"SS3CRETTOKEN", "S"},
		{"tail S3CRETTOK", "tail S3CRETTOK"},
	}
	for _, tc := range tests {
		for name, r := range map[string]io.Reader{
			"whole":    strings.NewReader(tc.in),
			"one byte": iotest.OneByteReader(strings.NewReader(tc.in)),
			"halves":   iotest.HalfReader(strings.NewReader(tc.in)),
		} {
			got, err := io.ReadAll(newScrubber(io.NopCloser(r), secret))
			if err != nil || string(got) != tc.want {
				t.Errorf("%s %q: %q, %v; want %q", name, tc.in, got, err, tc.want)
			}
		}
	}
}
