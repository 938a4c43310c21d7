// Package testkit holds what the tests and benchmarks of every service
// share: waiting for a condition with a deadline, reporting latencies as
// percentiles, finding the repository, and clients and readings that tests
// on several sides take alike.
//
// The packages below it are the rest of the test and benchmark support:
// benchbase (the baselines of the benchmark commands), launch (a codemode
// binary as a child process), redistest, dockertest, testenv, testlog and
// apistest. No service binary imports any of them, which
// TestServicesShipNoTestKit checks.
package testkit
