// The edge under test: its base URL comes from CODEMODE_EDGE_URL, which the
// Go tests in edge/e2e set to a stack they started on loopback.

import assert from "node:assert/strict";

export function edgeURL() {
  const raw = process.env.CODEMODE_EDGE_URL;
  assert.ok(raw, "CODEMODE_EDGE_URL is not set: run these tests through `go test ./edge/e2e -run TestWeb`, which starts a stack and sets it");
  const url = new URL(raw);
  // These tests send traffic to loopback only.
  assert.ok(["127.0.0.1", "localhost", "[::1]"].includes(url.hostname), `CODEMODE_EDGE_URL ${raw} is not a loopback address`);
  return url;
}
