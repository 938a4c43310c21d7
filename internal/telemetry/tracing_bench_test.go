package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
)

type languagesHandler struct {
	controlplanev1connect.UnimplementedControlPlaneServiceHandler
}

func (languagesHandler) ListLanguages(context.Context, *connect.Request[cpv1.ListLanguagesRequest]) (*connect.Response[cpv1.ListLanguagesResponse], error) {
	return connect.NewResponse(&cpv1.ListLanguagesResponse{}), nil
}

// BenchmarkConnectCall measures what tracing adds to one Connect call over
// loopback HTTP, as between two codemode services: "off" is a service
// without OTEL_EXPORTER_OTLP_ENDPOINT (no interceptor), "on" gives the
// client and the handler otelconnect's spans, propagates traceparent and
// exports every span in batches to an OTLP receiver on loopback.
func BenchmarkConnectCall(b *testing.B) {
	rec := &receiver{}
	collector := httptest.NewServer(rec)
	defer collector.Close()
	for _, on := range []bool{false, true} {
		name := "off"
		env := map[string]string{}
		if on {
			name = "on"
			env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.URL
		}
		b.Run(name, func(b *testing.B) {
			b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
			tr, err := NewTracing(context.Background(), ServiceControlPlane, func(k string) string { return env[k] }, TrustRemote())
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Shutdown(context.Background())
			mux := http.NewServeMux()
			mux.Handle(controlplanev1connect.NewControlPlaneServiceHandler(languagesHandler{}, tr.HandlerOptions()...))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			client := controlplanev1connect.NewControlPlaneServiceClient(srv.Client(), srv.URL, tr.ClientOptions()...)
			// The caller's span, as a door's would be.
			ctx, span := tr.Tracer().Start(context.Background(), "door")
			defer span.End()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.ListLanguages(ctx, connect.NewRequest(&cpv1.ListLanguagesRequest{})); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
