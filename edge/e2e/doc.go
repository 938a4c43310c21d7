// Package e2e tests the whole codemode stack as users meet it: the three
// binaries built from source and started as processes on loopback, a real
// Docker Engine with gVisor (runsc), and every door of the edge (Connect
// JSON, gRPC, gRPC-Web, MCP) plus the control plane's seed endpoints.
//
// The tests need a reachable Docker daemon with the runsc runtime and the
// sandbox image; `make test` prepares them. Without a daemon they are skipped.
package e2e
