package fleet

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // "" means valid
	}{
		{name: "ascii", in: "lab"},
		{name: "unicode letters and spaces inside", in: "été lab 2"},
		{name: "e-mail", in: "alice@example.org"},
		{name: "empty", in: "", wantErr: "is empty"},
		{name: "too long", in: strings.Repeat("x", MaxNameBytes+1), wantErr: "the limit is 255"},
		{name: "invalid utf-8", in: "a\xffb", wantErr: "not valid UTF-8"},
		{name: "leading space", in: " lab", wantErr: "starts or ends with spaces"},
		{name: "slash", in: "a/b", wantErr: "contains '/'"},
		{name: "newline", in: "a\nb", wantErr: "control characters"},
		{name: "right-to-left override", in: "a\u202eb", wantErr: "invisible or direction-changing"},
		{name: "zero-width space", in: "a\u200bb", wantErr: "invisible or direction-changing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName("server", tc.in)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("ValidateName(%q) = %v, want nil", tc.in, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("ValidateName(%q) = %v, want an error containing %q", tc.in, err, tc.wantErr)
			}
		})
	}
}
