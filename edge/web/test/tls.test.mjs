// The edge over HTTPS, with a certificate of a test's own CA, which node
// trusts through NODE_EXTRA_CA_CERTS: the MCP TypeScript SDK connects and
// runs code.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { edgeURL } from "./edge.mjs";

test("the MCP TypeScript SDK runs code over TLS", async () => {
  const url = edgeURL();
  assert.equal(url.protocol, "https:");
  assert.ok(process.env.NODE_EXTRA_CA_CERTS, "NODE_EXTRA_CA_CERTS names the edge's CA");
  const client = new Client({ name: "codemode-tls-test", version: "0.1.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL("/mcp", url)));
  try {
    const res = await client.callTool({ name: "execute_code", arguments: { language: "python", code: "print(6*7)" } });
    assert.notEqual(res.isError, true);
    assert.match(res.content.filter((c) => c.type === "text").map((c) => c.text).join(""), /42/);
  } finally {
    await client.close();
  }
});
