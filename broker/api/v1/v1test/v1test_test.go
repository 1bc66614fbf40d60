package v1test_test

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/api/v1/v1test"
)

func TestFullReclaimPolicySetsEveryField(t *testing.T) {
	if z := v1test.ZeroFields(v1test.FullReclaimPolicy()); len(z) != 0 {
		t.Errorf("fields the fixture leaves zero: %v; set them in FullReclaimPolicy", z)
	}
}

// TestZeroFieldsFindsWhatIsMissing: the check itself can fail.
func TestZeroFieldsFindsWhatIsMissing(t *testing.T) {
	p := v1test.FullReclaimPolicy()
	p.DryRun, p.UpdatedAt = false, nil
	p.Overrides[1].Exempt = false
	got := v1test.ZeroFields(p)
	if diff := cmp.Diff([]string{"DryRun", "Overrides[].Exempt", "UpdatedAt"}, got); diff != "" {
		t.Errorf("zero fields (-want +got):\n%s", diff)
	}
	if got, n := len(v1test.ZeroFields(v1.ReclaimPolicy{})), reflect.TypeFor[v1.ReclaimPolicy]().NumField(); got != n {
		t.Errorf("the zero policy has %d zero fields, want all %d", got, n)
	}
}
