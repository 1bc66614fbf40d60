package fleet

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// SharingMode is how a server shares its GPU; see v1.SharingMode.
type SharingMode = v1.SharingMode

// The sharing modes (v1's constants, under the domain's names).
const (
	SharingSliced    = v1.SharingSliced
	SharingExclusive = v1.SharingExclusive
	SharingMIG       = v1.SharingMIG
	SharingMPS       = v1.SharingMPS
)

// ModeOf returns m, or SharingSliced for "" (records made before sharing
// modes existed).
func ModeOf(m SharingMode) SharingMode {
	if m == "" {
		return SharingSliced
	}
	return m
}

// Whole reports whether a server of mode m holds its device whole (one
// server per GPU or MIG instance) rather than a share of it.
func Whole(m SharingMode) bool { return m == SharingExclusive || m == SharingMIG }

// modeList is the valid modes for messages: "sliced, exclusive, mig, mps".
func modeList() string {
	names := make([]string, len(v1.SharingModes))
	for i, m := range v1.SharingModes {
		names[i] = string(m)
	}
	return strings.Join(names, ", ")
}

// migProfile is a MIG device profile as NVIDIA names them ("1g.18gb",
// "3g.71gb", "1g.18gb+me", and for a compute instance smaller than its GPU
// instance "1c.3g.71gb"): GPU-instance slices, memory in GB, an optional
// "+me" (media extensions) suffix, optionally a leading compute-slice count.
var migProfile = regexp.MustCompile(`^([1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]{0,3}gb(\+me)?$`)

// ValidateMIGProfile reports whether name is a MIG profile name such as
// "1g.18gb" or "3g.71gb".
func ValidateMIGProfile(name string) error {
	if name == "" {
		return errors.New("migProfile is empty; name a MIG profile such as 1g.18gb or 3g.71gb (nvidia-smi mig -lgip lists a GPU's)")
	}
	if !migProfile.MatchString(name) {
		return fmt.Errorf("migProfile %q is not a MIG profile name such as 1g.18gb, 3g.71gb or 1g.18gb+me", name)
	}
	return nil
}

// ValidateSharing reports every problem with the sharing mode, MIG profile
// and slice of a profile together; hasSlice says whether the profile gave a
// slice at all. Each message says why the combination does not work.
func ValidateSharing(mode SharingMode, mig string, s Slice, hasSlice bool) []error {
	var errs []error
	if !mode.Valid() {
		return []error{fmt.Errorf("sharing must be one of %s, got %q", modeList(), mode)}
	}
	if mode != SharingMIG && mig != "" {
		errs = append(errs, fmt.Errorf("migProfile %q is only for sharing: mig (this profile is %s)", mig, mode))
	}
	switch mode {
	case SharingSliced, SharingMPS:
		if !hasSlice {
			errs = append(errs, fmt.Errorf("sharing %s needs a slice (memoryMiB and computePercent)", mode))
			break
		}
		errs = append(errs, unjoin(ValidateSlice(s))...)
		if mode == SharingMPS && s.ComputeLimitPercent != s.ComputePercent {
			errs = append(errs, fmt.Errorf("sharing mps: computeLimitPercent must equal computePercent (%d) or be omitted: MPS caps a client's SMs at its active-thread percentage, so an MPS client cannot burst, got %d",
				s.ComputePercent, s.ComputeLimitPercent))
		}
	case SharingExclusive:
		if hasSlice {
			errs = append(errs, errors.New("sharing exclusive takes no slice: the server holds a whole GPU, all of its memory and SMs (use model to choose the kind of GPU)"))
		}
	case SharingMIG:
		if err := ValidateMIGProfile(mig); err != nil {
			errs = append(errs, fmt.Errorf("sharing mig: %w", err))
		}
		if hasSlice {
			errs = append(errs, errors.New("sharing mig takes no slice: a MIG instance's memory and SMs are fixed by its MIG profile"))
		}
	}
	return errs
}

// unjoin returns the errors joined in err (one level), or err itself.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// SharingWords names a profile's or server's sharing in words: "time-sliced
// slice", "whole GPU", "MIG instance 3g.71gb", "MPS client".
func SharingWords(mode SharingMode, mig string) string {
	mode = ModeOf(mode)
	if mode == SharingMIG && mig != "" {
		return mode.Words() + " " + mig
	}
	return mode.Words()
}

// ResizeRefusal returns why a running server of mode m cannot change its
// slice in place, or "" for a sliced server (which can). The sentence
// names what to do instead.
func ResizeRefusal(m SharingMode, mig string) string {
	switch ModeOf(m) {
	case SharingMIG:
		return fmt.Sprintf("a MIG instance's memory and SMs are fixed by its MIG profile (%s); a different size means a restart with a profile of another MIG profile", mig)
	case SharingExclusive:
		return "the server holds a whole GPU; there is nothing to grow into, and a smaller share means a restart with a time-sliced or MPS profile"
	case SharingMPS:
		return "MPS fixes a client's active-thread percentage and pinned memory limit when its CUDA context starts, and every MPS client of a GPU runs at one size; a different size means a restart with another MPS profile"
	}
	return ""
}

// ModeName is a mode as the capacity messages say it: "MIG mode", "MPS
// mode", "exclusive mode", "sliced mode".
func ModeName(m SharingMode) string {
	switch ModeOf(m) {
	case SharingMIG:
		return "MIG mode"
	case SharingMPS:
		return "MPS mode"
	}
	return string(ModeOf(m)) + " mode"
}
