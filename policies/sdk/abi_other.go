//go:build !wasip1

package sdk

// Off wasip1 the handlers are kept so that a policy's logic can be unit
// tested natively through Request, Result and Init.

var (
	requestHandler func(*RequestInput) RequestDecision
	resultHandler  func(*ResultInput) ResultDecision
	initHandler    func(config []byte) error
)

func handleRequest(f func(*RequestInput) RequestDecision) { requestHandler = f }
func handleResult(f func(*ResultInput) ResultDecision)    { resultHandler = f }
func handleInit(f func([]byte) error)                     { initHandler = f }
