package cluster

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
)

func TestNotStarted(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: taken, then released.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+addr+"/", nil)
	_, dialErr := http.DefaultClient.Do(req)
	if dialErr == nil {
		t.Fatal("a request to a closed port succeeded")
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"dial refused", connect.NewError(connect.CodeUnavailable, dialErr), true},
		{"marked by the service", wire(MarkNotStarted(connect.NewError(connect.CodeUnavailable, errors.New("away")))), true},
		{"the service's answer, unmarked", wire(connect.NewError(connect.CodeUnavailable, errors.New("died"))), false},
		{"marked but not from the wire", MarkNotStarted(connect.NewError(connect.CodeUnavailable, errors.New("x"))), false},
		{"a connection that broke", connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "read", Err: errors.New("reset")}), false},
		{"nil", nil, false},
	} {
		if got := NotStarted(tc.err); got != tc.want {
			t.Errorf("%s: NotStarted(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// wire returns err as a client sees it, decoded from a handler's answer on
// loopback: connect counts an error as from the wire only then.
func wire(err *connect.Error) error {
	h := connect.NewUnaryHandler("/t.T/M", func(context.Context, *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
		return nil, err
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := connect.NewClient[emptypb.Empty, emptypb.Empty](srv.Client(), srv.URL+"/t.T/M")
	_, got := c.CallUnary(context.Background(), connect.NewRequest(&emptypb.Empty{}))
	return got
}
