package testkit

import (
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
)

// ErrorDetail returns the first detail of type T that err, a Connect
// error, carries; T's zero value (a nil message, whose getters return
// their zero values) if err is not a Connect error or carries none.
func ErrorDetail[T proto.Message](err error) T {
	var zero T
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return zero
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if m, ok := v.(T); ok {
				return m
			}
		}
	}
	return zero
}
