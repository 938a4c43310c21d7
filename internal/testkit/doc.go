// Package testkit holds what the tests and benchmarks of every service
// share: waiting for a condition with a deadline, reporting latencies as
// percentiles, finding the repository, an HTTP/1.1-only client, and reading
// a metric, a Connect error's detail or an MCP tool's text.
//
// The packages below it are the rest of the test and benchmark support:
// benchbase (the baselines of the benchmark commands and the containers'
// cgroups they read), launch (a codemode binary as a child process),
// promtext (a service's /metrics), redistest, dockertest, testenv, testlog
// and apistest. No service binary imports any of them, which
// TestServicesShipNoTestKit checks.
package testkit
