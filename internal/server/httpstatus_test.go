package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TestHTTPStatusIsConnects checks HTTPStatus against connect-go itself:
// for every code, and codes Connect does not define, a real Connect
// handler fails with the code over real HTTP and answers with the status
// HTTPStatus gives.
func TestHTTPStatusIsConnects(t *testing.T) {
	t.Parallel()
	const procedure = "/codemode.test.v1.StatusService/Fail"
	fail := connect.NewUnaryHandler(procedure, func(_ context.Context, req *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
		code, err := strconv.Atoi(req.Header().Get("Want-Code"))
		if err != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.Code(code), errors.New("failed as asked"))
	})
	srv := httptest.NewServer(fail)
	t.Cleanup(srv.Close)

	codes := []connect.Code{17, 99}
	for c := connect.CodeCanceled; c <= connect.CodeUnauthenticated; c++ {
		codes = append(codes, c)
	}
	for _, code := range codes {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+procedure, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Connect-Protocol-Version", "1")
			req.Header.Set("Want-Code", strconv.Itoa(int(code)))
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if got := HTTPStatus(code); got != res.StatusCode {
				t.Errorf("HTTPStatus(%v) = %d, Connect answers %d", code, got, res.StatusCode)
			}
		})
	}
}
