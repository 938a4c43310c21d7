// The edge's MCP doors, driven by the official MCP TypeScript SDK over
// streamable HTTP, and over stdio through `edge mcp-stdio`.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { edgeURL } from "./edge.mjs";

async function connect(path, { base = edgeURL(), key } = {}) {
  const client = new Client({ name: "codemode-web-test", version: "0.1.0" });
  const requestInit = key ? { headers: { Authorization: `Bearer ${key}` } } : undefined;
  await client.connect(new StreamableHTTPClientTransport(new URL(path, base), { requestInit }));
  return client;
}

const text = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text).join("");

const tools = ["close_session", "create_session", "execute_code", "list_files", "list_languages", "read_file", "write_file"];

// run calls execute_code and fails the test unless the tool succeeded.
async function run(client, args, options) {
  const res = await client.callTool({ name: "execute_code", arguments: args }, undefined, options);
  assert.notEqual(res.isError, true, `tool failed: ${text(res)}`);
  return res;
}

describe("/mcp", { concurrency: true }, () => {
  let client;
  before(async () => {
    // Tool descriptions name the interpreter versions, which an agent
    // knows once it has started a sandbox: wait for that, then connect.
    const probe = await connect("/mcp");
    try {
      for (let i = 0; i < 120; i++) {
        const res = await probe.callTool({ name: "list_languages", arguments: {} });
        if (res.structuredContent?.languages?.some((l) => l.name === "python" && l.version)) break;
        await new Promise((r) => setTimeout(r, 500));
      }
    } finally {
      await probe.close();
    }
    client = await connect("/mcp");
  });
  after(async () => {
    await client?.close();
  });

  test("names the server and lists its tools with true annotations", async () => {
    assert.equal(client.getServerVersion()?.name, "codemode");
    const { tools: listed } = await client.listTools();
    assert.deepEqual(listed.map((t) => t.name).sort(), tools);
    const byName = Object.fromEntries(listed.map((t) => [t.name, t]));
    const exec = byName.execute_code;
    assert.ok(exec.inputSchema.required.includes("code"), "code is required");
    // The enum is the agents' table, as list_languages reports it.
    const listedLanguages = (await client.callTool({ name: "list_languages", arguments: {} })).structuredContent.languages.map((l) => l.name).sort();
    for (const l of ["bash", "c", "javascript", "python", "sh"]) {
      assert.ok(listedLanguages.includes(l), `list_languages lists ${l}: ${listedLanguages}`);
    }
    assert.deepEqual([...exec.inputSchema.properties.language.enum].sort(), listedLanguages);
    assert.ok(exec.outputSchema?.properties?.exit_code, "execute_code has an output schema");
    assert.match(exec.description, /no network/);
    // The shipped GitHub declaration is there, but no egress: code cannot reach it.
    assert.doesNotMatch(exec.description, /github\.api\.codemode/);
    assert.match(exec.description, /\/workspace/);
    assert.match(exec.description, /python \(3\.\d+/, "the description names the interpreter versions");
    assert.deepEqual(
      { ro: exec.annotations.readOnlyHint, idem: exec.annotations.idempotentHint, open: exec.annotations.openWorldHint },
      { ro: false, idem: false, open: false },
    );
    for (const name of ["read_file", "list_files", "list_languages"]) {
      const a = byName[name].annotations;
      assert.ok(a.readOnlyHint && a.idempotentHint && a.openWorldHint === false, `${name} annotations ${JSON.stringify(a)}`);
    }
    assert.deepEqual(byName.create_session.inputSchema.properties.language.enum.sort(), listedLanguages);
  });

  test("execute_code runs python and returns 42", async () => {
    const res = await run(client, { language: "python", code: "print(6*7)" });
    assert.equal(text(res).trim(), "42");
    assert.equal(res.structuredContent.stdout, "42\n");
    assert.equal(res.structuredContent.exit_code, 0);
    assert.ok(res.structuredContent.duration_ms >= 0);
  });

  test("a program with no language runs as python", async () => {
    const res = await run(client, { code: "import sys; print(sys.version_info[0])" });
    assert.equal(res.structuredContent.stdout, "3\n");
  });

  test("a failing program is a result with its exit code and stderr", async () => {
    const res = await run(client, { language: "bash", code: "echo out; echo oops >&2; exit 3" });
    assert.equal(res.structuredContent.exit_code, 3);
    assert.equal(res.structuredContent.stderr, "oops\n");
    assert.match(text(res), /exit code 3/);
  });

  test("an invalid language is a tool error listing the valid ones", async () => {
    const res = await client.callTool({ name: "execute_code", arguments: { language: "cobol", code: "DISPLAY 42" } });
    assert.equal(res.isError, true, `want isError, got ${JSON.stringify(res)}`);
    for (const l of ["python", "javascript", "bash", "sh"]) {
      assert.match(text(res), new RegExp(l), `the error names ${l}: ${text(res)}`);
    }
    const again = await client.callTool({ name: "list_languages", arguments: {} });
    assert.notEqual(again.isError, true);
  });

  test("list_languages lists python", async () => {
    const res = await client.callTool({ name: "list_languages", arguments: {} });
    assert.notEqual(res.isError, true, `tool failed: ${text(res)}`);
    const names = res.structuredContent.languages.map((l) => l.name);
    assert.ok(names.includes("python"), `languages: ${names}`);
  });

  test("progress notifications carry output as it is produced, before the result", async () => {
    const seen = [];
    let resultAt;
    const res = await run(
      client,
      { code: "import time\nfor i in range(3):\n    print(f'line {i}'); time.sleep(1)" },
      { onprogress: (p) => seen.push({ message: p.message ?? "", at: Date.now() }) },
    );
    resultAt = Date.now();
    assert.equal(res.structuredContent.stdout, "line 0\nline 1\nline 2\n", "the result carries the whole output");
    const withText = seen.filter((p) => /line \d/.test(p.message));
    assert.ok(withText.length >= 3, `want 3 progress notifications with output, got ${JSON.stringify(seen)}`);
    const output = seen.filter((p) => !/^\[running for/.test(p.message)).map((p) => p.message);
    assert.equal(output.join(""), "line 0\nline 1\nline 2\n", "the notifications carry the output in order");
    assert.ok(withText[0].at < resultAt - 1000, "the first line came a second or more before the result");
  });

  test("a 65 s silent run outlives the 60 s default request timeout through heartbeats", async () => {
    let beats = 0;
    const res = await run(
      client,
      { code: "import time\ntime.sleep(65)\nprint('done')", timeout_seconds: 90 },
      { onprogress: () => beats++, resetTimeoutOnProgress: true },
    );
    assert.equal(res.structuredContent.stdout, "done\n");
    assert.ok(beats >= 4, `want a heartbeat at least every 15 s, got ${beats}`);
  });

  test("a cancelled call stops its program in the sandbox", async () => {
    const sess = await client.callTool({ name: "create_session", arguments: { language: "python" } });
    assert.notEqual(sess.isError, true, text(sess));
    const id = sess.structuredContent.session_id;
    const abort = new AbortController();
    const started = new Promise((resolve) => {
      const call = client.callTool(
        {
          name: "execute_code",
          arguments: {
            session_id: id,
            timeout_seconds: 120,
            code: "import subprocess, time\nsubprocess.Popen(['sleep', '271'])\nprint('started')\ntime.sleep(110)",
          },
        },
        undefined,
        // Resolved with a wrapper: a promise resolved with a promise would
        // wait for the call to end.
        { signal: abort.signal, onprogress: (p) => /started/.test(p.message ?? "") && resolve({ call }) },
      );
      call.catch(() => {});
    });
    const { call } = await started;
    abort.abort();
    await assert.rejects(call);
    // The session runs one program at a time: poll until the cancelled one
    // is gone, then look for any process of it.
    const ps = "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try: print(open(f'/proc/{p}/cmdline').read().replace('\\0', ' '))\n        except OSError: pass";
    let listing;
    for (let i = 0; i < 40; i++) {
      const res = await client.callTool({ name: "execute_code", arguments: { session_id: id, code: ps } });
      if (res.isError !== true) {
        listing = res.structuredContent.stdout;
        if (!/sleep 271|time.sleep\(110\)/.test(listing)) break;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(listing !== undefined, "the session never ran again after the cancel");
    assert.doesNotMatch(listing, /sleep 271/, `a process of the cancelled run is left:\n${listing}`);
    const closed = await client.callTool({ name: "close_session", arguments: { session_id: id } });
    assert.notEqual(closed.isError, true, text(closed));
  });

  test("create_session and close_session: state lasts until the close, then runs say why they fail", async () => {
    const sess = await client.callTool({ name: "create_session", arguments: { language: "python" } });
    assert.notEqual(sess.isError, true, text(sess));
    const id = sess.structuredContent.session_id;
    assert.match(id, /^[0-9a-f]{32}$/);
    assert.equal(sess.structuredContent.language, "python");
    await run(client, { session_id: id, code: "x = 41" });
    const res = await run(client, { session_id: id, code: "print(x + 1)" });
    assert.equal(res.structuredContent.stdout, "42\n");
    const w = await client.callTool({ name: "write_file", arguments: { session_id: id, path: "a.txt", content: "hi" } });
    assert.notEqual(w.isError, true, text(w));
    const closed = await client.callTool({ name: "close_session", arguments: { session_id: id } });
    assert.notEqual(closed.isError, true, text(closed));
    const after = await client.callTool({ name: "execute_code", arguments: { session_id: id, code: "print(x)" } });
    assert.equal(after.isError, true, `a run in a closed session: ${JSON.stringify(after)}`);
    assert.match(text(after), /closed/);
    const read = await client.callTool({ name: "read_file", arguments: { session_id: id, path: "a.txt" } });
    assert.equal(read.isError, true);
    assert.match(text(read), /closed/);
  });

  test("create_session with a bad language is a tool error listing the valid ones", async () => {
    const res = await client.callTool({ name: "create_session", arguments: { language: "fortran" } });
    assert.equal(res.isError, true, JSON.stringify(res));
    assert.match(text(res), /python/);
    assert.match(text(res), /javascript/);
  });
});

describe("edge mcp-stdio", () => {
  const bin = process.env.CODEMODE_EDGE_BIN;
  test("lists tools, runs python and uses a session", { skip: !bin && "CODEMODE_EDGE_BIN is not set" }, async () => {
    const client = new Client({ name: "codemode-stdio-test", version: "0.1.0" });
    await client.connect(
      new StdioClientTransport({
        command: bin,
        args: ["mcp-stdio"],
        env: { CODEMODE_URL: edgeURL().origin, CODEMODE_API_KEY: process.env.CODEMODE_API_KEY ?? "" },
        stderr: "inherit",
      }),
    );
    try {
      const { tools: listed } = await client.listTools();
      assert.deepEqual(listed.map((t) => t.name).sort(), tools);
      const seen = [];
      // The SDK dispatches notifications a microtask after the response
      // that follows them: output the program writes as it ends may reach
      // only the result, so this one waits a little after printing.
      const res = await run(client, { code: "import time\nprint(6*7)\ntime.sleep(1)" }, { onprogress: (p) => seen.push(p.message) });
      assert.equal(res.structuredContent.stdout, "42\n");
      assert.ok(seen.join("").includes("42"), `progress over stdio: ${JSON.stringify(seen)}`);
      const sess = await client.callTool({ name: "create_session", arguments: {} });
      const id = sess.structuredContent.session_id;
      await run(client, { session_id: id, code: "y = 'kept'" });
      const again = await run(client, { session_id: id, code: "print(y)" });
      assert.equal(again.structuredContent.stdout, "kept\n");
      const closed = await client.callTool({ name: "close_session", arguments: { session_id: id } });
      assert.notEqual(closed.isError, true, text(closed));
    } finally {
      await client.close();
    }
  });
});

for (const path of ["/mcp-no-code-execute", "/no-code/mcp"]) describe(path, () => {
  test("lists no tool that executes code, and the declared API tools", async () => {
    const client = await connect(path);
    try {
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name).sort();
      // The edge's shipped declaration: GitHub's four tools. They are not
      // called here: they would reach GitHub (edge/e2e calls them against a
      // loopback fake).
      assert.deepEqual(names, [
        "github_list_user_closed_pull_requests",
        "github_list_user_issues",
        "github_list_user_pull_requests",
        "github_list_user_repos",
        "list_languages",
      ]);
      for (const t of tools.filter((t) => t.name.startsWith("github_"))) {
        assert.equal(t.annotations?.readOnlyHint, true, t.name);
        assert.equal(t.annotations?.openWorldHint, true, t.name);
        assert.deepEqual(t.inputSchema.required, ["username"], t.name);
      }
      await assert.rejects(
        client.callTool({ name: "execute_code", arguments: { language: "python", code: "print(1)" } }),
        (err) => /execute_code|unknown tool|not found/i.test(String(err?.message ?? err)),
      );
    } finally {
      await client.close();
    }
  });
});

// Apart from the concurrent tests above: importing matplotlib takes seconds of
// the sandbox's CPU, which would hold up their timing.
describe("/mcp artifacts", () => {
  let client;
  before(async () => {
    client = await connect("/mcp");
  });
  after(async () => {
    await client?.close();
  });

  test("execute_code returns a matplotlib figure as image content and other files as resources", async () => {
    const code = [
      "import matplotlib.pyplot as plt",
      "plt.bar(['a', 'b'], [3, 5])",
      "plt.show()",
      "open('/workspace/outputs/notes.txt', 'w').write('hello')",
    ].join("\n");
    const res = await run(client, { language: "python", code }, { timeout: 120000 });
    const images = res.content.filter((c) => c.type === "image");
    assert.equal(images.length, 1, `content: ${JSON.stringify(res.content.map((c) => c.type))}`);
    assert.equal(images[0].mimeType, "image/png");
    const png = Buffer.from(images[0].data, "base64");
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], "PNG signature");
    assert.equal(png.subarray(12, 16).toString("latin1"), "IHDR");
    assert.ok(png.readUInt32BE(16) > 100 && png.readUInt32BE(20) > 100, "a figure-sized image");
    const resources = res.content.filter((c) => c.type === "resource");
    assert.equal(resources.length, 1);
    assert.match(resources[0].resource.uri, /^codemode:\/\/runs\/[A-Za-z0-9_.-]+\/artifacts\/notes\.txt$/);
    assert.equal(resources[0].resource.text, "hello");
    assert.match(resources[0].resource.mimeType, /^text\/plain/);
    assert.deepEqual(
      res.structuredContent.artifacts.map((a) => [a.name, a.media_type, a.size]),
      [["figure-1.png", "image/png", png.length], ["notes.txt", resources[0].resource.mimeType, 5]],
    );
    assert.equal(res.structuredContent.artifacts[1].uri, resources[0].resource.uri);
    const again = await client.readResource({ uri: res.structuredContent.artifacts[0].uri });
    assert.deepEqual(Buffer.from(again.contents[0].blob, "base64"), png, "resources/read returns the figure's bytes");
    assert.match(text(res), /figure-1\.png \(image\/png/);
  });
});

// Resources, through an edge with API keys for two tenants (set by
// TestWebMCPWithTypeScriptSDK): what a run left in /workspace/outputs and a
// session's files are read again by their URIs, with the same bytes, by the
// tenant that made them; the other tenant gets an error and lists none.
describe("/mcp resources", { skip: !process.env.CODEMODE_KEYED_EDGE_URL && "CODEMODE_KEYED_EDGE_URL is not set" }, () => {
  const base = new URL(process.env.CODEMODE_KEYED_EDGE_URL ?? "http://127.0.0.1/");
  let alpha, beta;
  before(async () => {
    alpha = await connect("/mcp", { base, key: process.env.CODEMODE_API_KEY_A });
    beta = await connect("/mcp", { base, key: process.env.CODEMODE_API_KEY_B });
  });
  after(async () => {
    await alpha?.close();
    await beta?.close();
  });

  test("a run's artifacts and a session's files, for their tenant only", async () => {
    assert.ok(alpha.getServerCapabilities()?.resources, "the resources capability");
    const code = [
      "import os",
      "os.makedirs('/workspace/outputs/data', exist_ok=True)",
      "open('/workspace/outputs/notes.txt', 'w').write('notes of alpha')",
      "open('/workspace/outputs/data/all.bin', 'wb').write(bytes(range(256)))",
    ].join("\n");
    const res = await run(alpha, { language: "python", code });
    const artifacts = res.structuredContent.artifacts;
    assert.deepEqual(artifacts.map((a) => a.name).sort(), ["data/all.bin", "notes.txt"]);
    const embedded = Object.fromEntries(res.content.filter((c) => c.type === "resource").map((c) => [c.resource.uri, c.resource]));
    for (const a of artifacts) {
      const inResult = embedded[a.uri];
      assert.ok(inResult, `${a.uri} is among the result's resources: ${Object.keys(embedded)}`);
      const bytesOf = (c) => (c.blob !== undefined ? Buffer.from(c.blob, "base64") : Buffer.from(c.text, "utf8"));
      const read = await alpha.readResource({ uri: a.uri });
      assert.deepEqual(bytesOf(read.contents[0]), bytesOf(inResult), `resources/read ${a.uri}: the result's bytes`);
      assert.equal(bytesOf(read.contents[0]).length, a.size);
      await assert.rejects(beta.readResource({ uri: a.uri }), `the other tenant read ${a.uri}`);
    }

    const session = (await alpha.callTool({ name: "create_session", arguments: { language: "python" } })).structuredContent.session_id;
    try {
      const wrote = await alpha.callTool({ name: "write_file", arguments: { session_id: session, path: "in/data.csv", content: "x,y\n1,2\n" } });
      assert.notEqual(wrote.isError, true, text(wrote));
      const uri = wrote.structuredContent.uri;
      assert.equal(uri, `codemode://sessions/${session}/files/in/data.csv`);
      const read = await alpha.readResource({ uri });
      assert.equal(read.contents[0].text, "x,y\n1,2\n");
      await assert.rejects(beta.readResource({ uri }), "the other tenant read a session's file");

      const listed = (await alpha.listResources()).resources.map((r) => r.uri);
      for (const u of [...artifacts.map((a) => a.uri), uri]) assert.ok(listed.includes(u), `resources/list lacks ${u}: ${listed}`);
      assert.deepEqual((await beta.listResources()).resources, [], "the other tenant lists nothing");
      const templates = (await alpha.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate).sort();
      assert.deepEqual(templates, ["codemode://runs/{run_id}/artifacts/{+name}", "codemode://sessions/{session_id}/files/{+path}"]);
    } finally {
      await alpha.callTool({ name: "close_session", arguments: { session_id: session } });
    }
  });

  test("every tool has an output schema", async () => {
    for (const t of (await alpha.listTools()).tools) assert.ok(t.outputSchema, `${t.name} has no output schema`);
  });
});
