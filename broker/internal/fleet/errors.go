package fleet

import (
	"errors"
	"fmt"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
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
	// ErrUnavailable means a part the broker depends on (Redis, the
	// Kubernetes API server) did not answer or take a write, or the store
	// could not confirm a write as durable (no Redis replica acknowledged a
	// placement in time; it was undone where possible); the same request
	// may succeed shortly. See UnavailableError.
	ErrUnavailable = errors.New("fleet: unavailable")
)

// The parts an UnavailableError names, in the words its message uses.
const (
	PartRedis      = "Redis (the broker's store)"
	PartKubernetes = "the Kubernetes API server"
)

// UnavailableError says that a part the broker depends on did not answer
// (refused the connection, timed out, is loading or failing over). It
// matches ErrUnavailable and unwraps to the cause.
type UnavailableError struct {
	// Part is what did not answer: PartRedis or PartKubernetes.
	Part string
	// Unknown, when set, says what may or may not have happened because
	// the part stopped answering midway ("nb may have started"); the same
	// request, repeated (with the same Idempotency-Key), finds out. Empty
	// means nothing took effect.
	Unknown string
	// Err is the cause, for logs; its text is not for people.
	Err error
}

func (e *UnavailableError) Error() string {
	if e.Err == nil {
		return e.Part + " is not answering"
	}
	return e.Part + " is not answering: " + e.Err.Error()
}

// Message is the sentence for people: what is unavailable, what may have
// happened, and what to do.
func (e *UnavailableError) Message() string {
	if e.Unknown == "" {
		return e.Part + " is not answering; try again in a few seconds"
	}
	return e.Part + " stopped answering midway, so " + e.Unknown +
		"; repeat the request in a few seconds (with the same Idempotency-Key) to find out"
}

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

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
	switch e.Resource {
	case "servers":
		return fmt.Sprintf("%s %s quota exceeded: it allows %d servers at once, and %d are in use", e.Scope, e.Name, e.Limit, e.Used)
	case "memoryMiB":
		return fmt.Sprintf("%s %s quota exceeded: it allows %d MiB of slice memory; %d MiB are in use and this needs %d MiB more",
			e.Scope, e.Name, e.Limit, e.Used, e.Want)
	default:
		return fmt.Sprintf("%s %s quota exceeded: it allows %d %% compute; %d %% are in use and this needs %d %% more",
			e.Scope, e.Name, e.Limit, e.Used, e.Want)
	}
}

// Is makes errors.Is(err, ErrQuotaExceeded) true.
func (e *QuotaError) Is(target error) bool { return target == ErrQuotaExceeded }

// RoomError refuses a resize that the GPU the server holds has no room
// for. It matches ErrNoCapacity.
type RoomError struct {
	GPU, Node string
	// MaxMiB and MaxComputePercent are the most the slice could have on
	// that GPU now.
	MaxMiB            int64
	MaxComputePercent int
	Want              Slice
}

func (e *RoomError) Error() string {
	return fmt.Sprintf("GPU %s on node %s has room for at most %d MiB and %d%% compute for this slice; %d MiB and %d%% were asked",
		e.GPU, e.Node, e.MaxMiB, e.MaxComputePercent, e.Want.MemoryMiB, e.Want.ComputePercent)
}

// Is makes errors.Is(err, ErrNoCapacity) true.
func (e *RoomError) Is(target error) bool { return target == ErrNoCapacity }

// InUseError refuses a memory shrink below what the notebook holds now
// (the node agent's fresh sample). It matches ErrConflict.
type InUseError struct {
	UsedMiB int64 // device memory the notebook's processes hold, MiB
	WantMiB int64 // the memory cap asked for, MiB
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("the notebook uses %d MiB now; memory cannot shrink below that", e.UsedMiB)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *InUseError) Is(target error) bool { return target == ErrConflict }

// Message returns the sentence a person should read for err: the text of a
// typed error (*CapacityError, *QuotaError, *UnavailableError) when there
// is one, otherwise
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
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return ue.Message()
	}
	var ie *InUseError
	if errors.As(err, &ie) {
		return ie.Error()
	}
	msg := err.Error()
	for _, s := range []error{ErrNotFound, ErrConflict, ErrNoCapacity, ErrQuotaExceeded, ErrInvalid, ErrForbidden, ErrNotReady, ErrUnavailable} {
		msg = strings.ReplaceAll(msg, s.Error()+": ", "")
	}
	return msg
}

// StateError refuses an action because of the state a server is in: a
// start while it is live, a remove while it is live, a step of a start
// that something else (a stop) overtook. It matches ErrConflict, and its
// text speaks to the server's user ("nb is still stopping; start it again
// when it has stopped"), never in state-machine words.
type StateError struct {
	Key ServerKey
	// State is the server's state now; SpawnID its current spawn, if known.
	State   State
	SpawnID string
	// Want is the state the action would have moved the server to:
	// pending for a start, "" for a remove.
	Want State
}

func (e *StateError) Error() string {
	n := e.Key.Name
	switch e.Want {
	case v1.StatePending:
		switch e.State {
		case v1.StateStopping:
			return n + " is still stopping; start it again when it has stopped"
		case v1.StateRunning:
			return n + " is already running; stop it first to start it again"
		default:
			return n + " is already starting; wait for it, or stop it first to start it again"
		}
	case "":
		if e.State == v1.StateStopping {
			return n + " is still stopping; remove it when it has stopped"
		}
		return n + " " + Doing(e.State) + "; stop it before removing it"
	case v1.StateStopping, v1.StateStopped:
		return n + " " + Doing(e.State) + ", so there is nothing to stop"
	default:
		return n + " " + Doing(e.State) + " now, so this step of its start was not taken"
	}
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *StateError) Is(target error) bool { return target == ErrConflict }
