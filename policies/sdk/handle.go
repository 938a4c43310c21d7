package sdk

// HandleRequest registers f as the policy's request-phase handler. Call it
// from an init function. f gets each request's input and returns the decision.
func HandleRequest(f func(in *RequestInput) RequestDecision) { handleRequest(f) }

// HandleResult registers f as the policy's result-phase handler. Call it
// from an init function.
func HandleResult(f func(in *ResultInput) ResultDecision) { handleResult(f) }

// HandleInit registers f to receive the policy's configuration bytes (from
// the edge's policy configuration file) once per instance, before any
// request. An error fails the load of the policy and is reported to the
// operator.
func HandleInit(f func(config []byte) error) { handleInit(f) }
