// Package v1test holds test fixtures of the wire types in broker/api/v1,
// shared by the tests of every part that carries them (the API, the store,
// the web pages), and the reflection check that keeps the fixtures
// complete. Standard library only; tests import it, programs never do.
package v1test

import (
	"fmt"
	"reflect"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// FullReclaimPolicy returns a valid reclaim policy in which every field,
// of the policy and of its overrides taken together, is set (not the zero
// value): a round trip that returns it unchanged carries every field.
// ZeroFields(FullReclaimPolicy()) is empty; a test that uses the fixture
// checks that first, so a field added to the wire type without a value
// here fails the test instead of silently escaping it.
func FullReclaimPolicy() v1.ReclaimPolicy {
	at := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	return v1.ReclaimPolicy{
		Version: 7, Enabled: true, IdleComputePercent: 7, IdleAfterSeconds: 3600, Action: v1.ReclaimShrink,
		WarnSeconds: 600, ShrinkComputePercent: 10, ExemptGroups: []string{"oncall", "vip"}, ExemptUsers: []string{"ceo"},
		StopAfterSeconds: 14400, MinRunningSeconds: 900, MaxAgeSeconds: 3 * 86400, MaxExtendSeconds: 7200, DryRun: true,
		Overrides: []v1.ReclaimOverride{
			{Profile: "large", IdleAfterSeconds: 1800, WarnSeconds: 300, StopAfterSeconds: 7200, MinRunningSeconds: 600,
				MaxAgeSeconds: 43200, Action: v1.ReclaimShrink, ShrinkComputePercent: 5},
			{Group: "research", Exempt: true},
		},
		Reason: "night shift", UpdatedBy: "root", UpdatedAt: &at, Source: v1.ReclaimPolicyStored,
	}
}

// ZeroFields lists the fields of v (a struct, or a pointer to one) that are
// the zero value, as paths like "Overrides[].Exempt". A slice of structs
// counts a field as set when any element sets it; an empty slice or nil
// pointer is itself a zero field.
func ZeroFields(v any) []string {
	var out []string
	zeroFields(reflect.ValueOf(v), "", &out)
	return out
}

func zeroFields(v reflect.Value, path string, out *[]string) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			*out = append(*out, path)
			return
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type() == reflect.TypeFor[time.Time]() {
		if v.IsZero() {
			*out = append(*out, path)
		}
		return
	}
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		p := f.Name
		if path != "" {
			p = path + "." + f.Name
		}
		fv := v.Field(i)
		if fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct {
			elemFields(fv, p, out)
			continue
		}
		zeroFields(fv, p, out)
	}
}

// elemFields reports the fields that no element of the slice s sets.
func elemFields(s reflect.Value, path string, out *[]string) {
	if s.Len() == 0 {
		*out = append(*out, path)
		return
	}
	t := s.Type().Elem()
	for i := range t.NumField() {
		if !t.Field(i).IsExported() {
			continue
		}
		set := false
		for j := range s.Len() {
			var sub []string
			zeroFields(s.Index(j).Field(i), "x", &sub)
			if len(sub) == 0 {
				set = true
				break
			}
		}
		if !set {
			*out = append(*out, fmt.Sprintf("%s[].%s", path, t.Field(i).Name))
		}
	}
}
