package fleet

import (
	"testing"
	"time"
)

func TestEpochTokenCarriesItsStart(t *testing.T) {
	at := time.Date(2026, 12, 1, 17, 0, 0, 123, time.UTC)
	got, ok := EpochBegan(NewEpoch(at, "ab12"))
	if !ok || !got.Equal(at) {
		t.Errorf("EpochBegan(NewEpoch(%v)) = %v, %v; want the same time", at, got, ok)
	}
	for _, old := range []string{"", "0123456789abcdef", "x-y"} {
		if _, ok := EpochBegan(old); ok {
			t.Errorf("EpochBegan(%q) ok, want not (a token of another shape)", old)
		}
	}
}
