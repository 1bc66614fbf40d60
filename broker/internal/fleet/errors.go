package fleet

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Callers test with errors.Is; the HTTP layer maps them to
// status codes in one table.
var (
	ErrNotFound      = errors.New("fleet: not found")
	ErrConflict      = errors.New("fleet: conflict")
	ErrNoCapacity    = errors.New("fleet: no capacity")
	ErrQuotaExceeded = errors.New("fleet: quota exceeded")
	ErrInvalid       = errors.New("fleet: invalid")
	ErrForbidden     = errors.New("fleet: forbidden")
	// ErrNotReady means allocations are being rebuilt (for example after
	// Redis lost its data) and placement must wait for the reconciler.
	ErrNotReady = errors.New("fleet: allocations are being rebuilt")
)

// CapacityError says why no GPU could take a slice. It matches ErrNoCapacity.
type CapacityError struct {
	Want Slice
	// Model is the constraint that was asked for, if any.
	Model string
	// Sharing and MIGProfile are the mode (and MIG profile) asked for; ""
	// is SharingSliced.
	Sharing    SharingMode
	MIGProfile string
	// Candidates is the number of healthy devices of that mode (of Model,
	// if set): GPUs, or for mig the MIG instances of MIGProfile.
	Candidates int
	// ModeGPUs is the number of registered GPUs in that mode and AllGPUs
	// of all physical GPUs (MIG instances not counted), for the sentence's
	// "2 of 7 GPUs are in MIG mode".
	ModeGPUs, AllGPUs int
	// LargestFreeMiB and LargestNode describe the GPU with the most free
	// memory among the candidates; LargestFreeComputePercent is its free compute.
	LargestFreeMiB            int64
	LargestFreeComputePercent int
	LargestNode               string
}

func (e *CapacityError) Error() string {
	mode := ModeOf(e.Sharing)
	if mode == SharingSliced {
		return e.sliced()
	}
	of := ""
	if e.Model != "" {
		of = fmt.Sprintf(" of model %q", e.Model)
	}
	counts := fmt.Sprintf("%d of %d GPUs are in %s", e.ModeGPUs, e.AllGPUs, ModeName(mode))
	switch mode {
	case SharingMIG:
		if e.Candidates == 0 {
			return fmt.Sprintf("no healthy GPU%s has a MIG instance of profile %s; %s", of, e.MIGProfile, counts)
		}
		return fmt.Sprintf("no MIG instance of profile %s%s is free; %s", e.MIGProfile, of, counts)
	case SharingExclusive:
		if e.Candidates == 0 {
			return fmt.Sprintf("no healthy GPU%s is in exclusive mode; %s", of, counts)
		}
		return fmt.Sprintf("no whole GPU%s is free: all %d healthy GPUs in exclusive mode hold a server; %s", of, e.Candidates, counts)
	default: // mps
		if e.Candidates == 0 {
			return fmt.Sprintf("no healthy GPU%s is in MPS mode; %s", of, counts)
		}
		return fmt.Sprintf("no GPU%s in MPS mode has %d MiB and %d%% compute free for an MPS client of this size (the MPS clients of one GPU all have one size); the GPU with the most free memory (%d MiB on node %s) has %d%% compute free; %s",
			of, e.Want.MemoryMiB, e.Want.ComputePercent, e.LargestFreeMiB, e.LargestNode, e.LargestFreeComputePercent, counts)
	}
}

// sliced is the sentence for a time-sliced request.
func (e *CapacityError) sliced() string {
	others := ""
	if e.AllGPUs > e.ModeGPUs {
		others = fmt.Sprintf(" (%d of %d GPUs are in sliced mode)", e.ModeGPUs, e.AllGPUs)
	}
	switch {
	case e.Candidates == 0 && e.Model != "":
		if others != "" {
			return fmt.Sprintf("no healthy GPU of model %q is in sliced mode%s", e.Model, others)
		}
		return fmt.Sprintf("no healthy GPU of model %q is registered", e.Model)
	case e.Candidates == 0 && others != "":
		return "no healthy GPU is in sliced mode" + others
	case e.Candidates == 0:
		return "no healthy GPU is registered"
	case e.LargestFreeMiB < e.Want.MemoryMiB:
		return fmt.Sprintf("no GPU has %d MiB free; the largest free block is %d MiB on node %s%s",
			e.Want.MemoryMiB, e.LargestFreeMiB, e.LargestNode, others)
	default:
		return fmt.Sprintf("no GPU has both %d MiB and %d%% compute free; the GPU with the most free memory (%d MiB on node %s) has %d%% compute free%s",
			e.Want.MemoryMiB, e.Want.ComputePercent, e.LargestFreeMiB, e.LargestNode, e.LargestFreeComputePercent, others)
	}
}

// Is makes errors.Is(err, ErrNoCapacity) true.
func (e *CapacityError) Is(target error) bool { return target == ErrNoCapacity }

// QuotaError says which cap a placement would exceed. It matches ErrQuotaExceeded.
type QuotaError struct {
	Scope    string // "user" or "group"
	Name     string // the user or group name
	Resource string // "servers", "memoryMiB" or "computePercent"
	Limit    int64
	Used     int64
	Want     int64
}

func (e *QuotaError) Error() string {
	unit := map[string]string{"servers": " servers", "memoryMiB": " MiB of slice memory", "computePercent": "% compute"}[e.Resource]
	return fmt.Sprintf("%s %s quota exceeded: %d%s in use, %d more asked, limit %d%s",
		e.Scope, e.Name, e.Used, unit, e.Want, e.Limit, unit)
}

// Is makes errors.Is(err, ErrQuotaExceeded) true.
func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }

// Message returns the sentence a person should read for err: the text of a
// typed error (*CapacityError, *QuotaError) when there is one, otherwise
// err's text with the sentinels' "fleet: …: " prefixes removed.
func Message(err error) string {
	if err == nil {
		return ""
	}
	var ce *CapacityError
	if errors.As(err, &ce) {
		return ce.Error()
	}
	var qe *QuotaError
	if errors.As(err, &qe) {
		return qe.Error()
	}
	msg := err.Error()
	for _, s := range []error{ErrNotFound, ErrConflict, ErrNoCapacity, ErrQuotaExceeded, ErrInvalid, ErrForbidden, ErrNotReady} {
		msg = strings.ReplaceAll(msg, s.Error()+": ", "")
	}
	return msg
}
