package fleet

import v1 "github.com/gpubroker/gpubroker/broker/api/v1"

// transitions lists, for each state, the states a server may move to it
// from. It is the single source of truth for the lifecycle: the store passes
// the allowed sources to its atomic update so a late or out-of-order event
// is refused there.
var transitions = map[State][]State{
	v1.StatePlacing:  {v1.StatePending},
	v1.StateCreating: {v1.StatePlacing},
	v1.StateStarting: {v1.StateCreating},
	v1.StateRunning:  {v1.StateStarting},
	v1.StateStopping: {v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning, v1.StateFailed},
	v1.StateStopped:  {v1.StateStopping, v1.StateRunning},
	v1.StateFailed:   {v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting},
}

// TransitionSources returns the states from which a server may move to to,
// in a fixed order; nil if no state leads to to (pending is only ever the
// first state of a new spawn).
func TransitionSources(to State) []State {
	return transitions[to]
}
