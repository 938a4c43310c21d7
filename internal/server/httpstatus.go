package server

import (
	"net/http"

	"connectrpc.com/connect"
)

// HTTPStatus maps a Connect code to the HTTP status the Connect protocol
// uses for it, for the doors that answer plain HTTP (the original's
// POST /run and GET /status, refusals before a request's protocol is
// known). Every code has its line; a code Connect does not define is
// unknown, 500.
func HTTPStatus(code connect.Code) int {
	switch code {
	case connect.CodeCanceled:
		return 499 // nginx's "client closed request"; net/http has no name for it
	case connect.CodeUnknown:
		return http.StatusInternalServerError
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeFailedPrecondition:
		return http.StatusBadRequest
	case connect.CodeAborted:
		return http.StatusConflict
	case connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeInternal:
		return http.StatusInternalServerError
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDataLoss:
		return http.StatusInternalServerError
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}
