// The edge's MCP doors, driven by the official MCP TypeScript SDK over
// streamable HTTP.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { edgeURL } from "./edge.mjs";

async function connect(path) {
  const client = new Client({ name: "codemode-web-test", version: "0.1.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(path, edgeURL())));
  return client;
}

const text = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text).join("");

describe("/mcp", () => {
  let client;
  before(async () => {
    client = await connect("/mcp");
  });
  after(async () => {
    await client?.close();
  });

  test("names the server and lists its tools", async () => {
    assert.equal(client.getServerVersion()?.name, "codemode");
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name).sort();
    assert.deepEqual(names, ["execute_code", "list_files", "list_languages", "read_file", "write_file"]);
    const exec = tools.find((t) => t.name === "execute_code");
    assert.ok(exec.inputSchema.properties.code, "execute_code takes code");
    assert.ok(exec.inputSchema.required.includes("code"), "code is required");
  });

  test("execute_code runs python and returns 42", async () => {
    const res = await client.callTool({ name: "execute_code", arguments: { language: "python", code: "print(6*7)" } });
    assert.notEqual(res.isError, true, `tool failed: ${text(res)}`);
    assert.equal(text(res).trim(), "42");
    assert.equal(res.structuredContent.stdout, "42\n");
    assert.equal(res.structuredContent.exit_code, 0);
    assert.ok(res.structuredContent.duration_ms >= 0);
  });

  test("a failing program is a result with its exit code and stderr", async () => {
    const res = await client.callTool({
      name: "execute_code",
      arguments: { language: "bash", code: "echo out; echo oops >&2; exit 3" },
    });
    assert.notEqual(res.isError, true, `tool failed: ${text(res)}`);
    assert.equal(res.structuredContent.exit_code, 3);
    assert.equal(res.structuredContent.stderr, "oops\n");
    assert.match(text(res), /exit code 3/);
  });

  test("an invalid language is a tool error, not a protocol failure", async () => {
    const res = await client.callTool({ name: "execute_code", arguments: { language: "cobol", code: "DISPLAY 42" } });
    assert.equal(res.isError, true, `want isError, got ${JSON.stringify(res)}`);
    assert.match(text(res), /language/i);
    // The session is still usable afterwards.
    const again = await client.callTool({ name: "list_languages", arguments: {} });
    assert.notEqual(again.isError, true);
  });

  test("list_languages lists python", async () => {
    const res = await client.callTool({ name: "list_languages", arguments: {} });
    assert.notEqual(res.isError, true, `tool failed: ${text(res)}`);
    const names = res.structuredContent.languages.map((l) => l.name);
    assert.ok(names.includes("python"), `languages: ${names}`);
  });
});

describe("/mcp-no-code-execute", () => {
  test("lists no tool that executes code", async () => {
    const client = await connect("/mcp-no-code-execute");
    try {
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name);
      assert.deepEqual(names, ["list_languages"]);
      await assert.rejects(
        client.callTool({ name: "execute_code", arguments: { language: "python", code: "print(1)" } }),
        (err) => /execute_code|unknown tool|not found/i.test(String(err?.message ?? err)),
      );
    } finally {
      await client.close();
    }
  });
});
