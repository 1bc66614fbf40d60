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
	// ErrUnavailable means a part the operation needs (the Kubernetes API)
	// did not answer or take a write; nothing changed, and the same request
	// can be sent again.
	ErrUnavailable = errors.New("fleet: unavailable")
	// ErrStoreUnavailable means the broker's store (Redis) did not answer:
	// restarting, failing over, unreachable. It matches ErrUnavailable.
	ErrStoreUnavailable = fmt.Errorf("%w: the store did not answer", ErrUnavailable)
)

// CapacityError says why no GPU could take a slice. It matches ErrNoCapacity.
type CapacityError struct {
	Want Slice
	// Model is the constraint that was asked for, if any.
	Model string
	// Candidates is the number of healthy GPUs (of Model, if set).
	Candidates int
	// LargestFreeMiB and LargestNode describe the GPU with the most free
	// memory among the candidates; LargestFreeComputePercent is its free compute.
	LargestFreeMiB            int64
	LargestFreeComputePercent int
	LargestNode               string
}

func (e *CapacityError) Error() string {
	switch {
	case e.Candidates == 0 && e.Model != "":
		return fmt.Sprintf("no healthy GPU of model %q is registered", e.Model)
	case e.Candidates == 0:
		return "no healthy GPU is registered"
	case e.LargestFreeMiB < e.Want.MemoryMiB:
		return fmt.Sprintf("no GPU has %d MiB free; the largest free block is %d MiB on node %s",
			e.Want.MemoryMiB, e.LargestFreeMiB, e.LargestNode)
	default:
		return fmt.Sprintf("no GPU has both %d MiB and %d%% compute free; the GPU with the most free memory (%d MiB on node %s) has %d%% compute free",
			e.Want.MemoryMiB, e.Want.ComputePercent, e.LargestFreeMiB, e.LargestNode, e.LargestFreeComputePercent)
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
