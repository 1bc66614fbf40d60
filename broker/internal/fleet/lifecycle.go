package fleet

import v1 "github.com/gpubroker/gpubroker/broker/api/v1"

// transitions lists, for each state, the states a server may move to it
// from. It is the single source of truth for the lifecycle: the store passes
// the allowed sources to its atomic update so a late or out-of-order event
// is refused there. A failed spawn stays failed (its reason with it) until
// the next start; stopping it only makes sure nothing of it is left.
var transitions = map[State][]State{
	v1.StatePlacing:  {v1.StatePending},
	v1.StateCreating: {v1.StatePlacing},
	v1.StateStarting: {v1.StateCreating},
	v1.StateRunning:  {v1.StateStarting},
	v1.StateStopping: {v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning},
	v1.StateStopped:  {v1.StateStopping, v1.StateRunning},
	v1.StateFailed:   {v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting},
}

// TransitionSources returns the states from which a server may move to to,
// in a fixed order; nil if no state leads to to (pending is only ever the
// first state of a new spawn).
func TransitionSources(to State) []State {
	return transitions[to]
}

// Doing says what a server in state s is doing, as the end of a sentence
// that starts with its name: "nb " + Doing(s) reads "nb is still
// stopping". For conflicts told to people, never the state's bare word.
func Doing(s State) string {
	switch s {
	case v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting:
		return "is starting"
	case v1.StateRunning:
		return "is running"
	case v1.StateStopping:
		return "is still stopping"
	case v1.StateStopped:
		return "is stopped"
	case v1.StateFailed:
		return "has failed"
	}
	return "is " + string(s)
}
