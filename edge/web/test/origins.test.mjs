// Pages the edge did not serve cannot use it: Debian's Chromium, driven by
// playwright-core, loads a page from another origin (another loopback port,
// served by this test) and tries every door of an edge without API keys,
// with the requests a page may send without asking (a text/plain POST,
// no-cors) and with those that need a CORS preflight. It gets nothing back,
// and the edge's metrics show that nothing ran. A page at a host name
// rebound to the edge's address (DNS rebinding) is refused too. An edge
// with --allowed-origins for that page's origin serves it, and the
// playground the edge serves itself still runs code.
//
// Environment (set by TestWebOtherOriginsInChromium in edge/e2e):
// CODEMODE_EDGE_URL (the edge without keys), CODEMODE_EDGE_METRICS_URL (its
// /metrics), CODEMODE_PAGE_PORT (the loopback port to serve the other page
// on) and CODEMODE_ALLOWING_EDGE_URL (an edge started with
// --allowed-origins http://127.0.0.1:$CODEMODE_PAGE_PORT).

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";
import { launch } from "./browser.mjs";
import { edgeURL } from "./edge.mjs";

const rebound = "rebind.test";
const executePath = "/codemode.edge.v1.ExecutionService/Execute";
// code prints "ran-here", which neither it nor an error quoting a request
// (a port, an origin) contains.
const code = "print('ran' + '-here')";

// executions sums codemode_executions_total of the edge: every execution
// that reached its execution service, run or refused there.
async function executions() {
  const res = await fetch(process.env.CODEMODE_EDGE_METRICS_URL);
  assert.equal(res.status, 200);
  let sum = 0;
  for (const line of (await res.text()).split("\n")) {
    if (line.startsWith("codemode_executions_total{")) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

// attempts runs in the page: it sends each request to the edge at base and
// returns what the page could see of each answer.
async function attempts({ base, code, executePath }) {
  const enc = new TextEncoder();
  const field = (n, s) => {
    const b = enc.encode(s);
    return [(n << 3) | 2, b.length, ...b]; // lengths below 128
  };
  const msg = new Uint8Array([...field(1, "python"), ...field(2, code)]);
  const framed = new Uint8Array(5 + msg.length);
  new DataView(framed.buffer).setUint32(1, msg.length);
  framed.set(msg, 5);
  const json = JSON.stringify({ language: "python", code });
  const initialize = JSON.stringify({
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "page", version: "1" } },
  });
  const requests = {
    "connect json": [executePath, { method: "POST", headers: { "Content-Type": "application/json" }, body: json }],
    "grpc-web": [executePath, { method: "POST", headers: { "Content-Type": "application/grpc-web+proto", "X-Grpc-Web": "1" }, body: framed }],
    "connect text/plain": [executePath, { method: "POST", headers: { "Content-Type": "text/plain" }, body: json }],
    "run json": ["/run", { method: "POST", headers: { "Content-Type": "application/json" }, body: json }],
    "run text/plain": ["/run", { method: "POST", headers: { "Content-Type": "text/plain" }, body: json }],
    "run no-cors": ["/run", { method: "POST", mode: "no-cors", body: json }],
    "mcp initialize": [
      "/mcp",
      { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream" }, body: initialize },
    ],
    "mcp no-cors": ["/mcp", { method: "POST", mode: "no-cors", headers: { Accept: "application/json, text/event-stream" }, body: initialize }],
    "mcp-no-code-execute initialize": [
      "/mcp-no-code-execute",
      { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream" }, body: initialize },
    ],
    status: ["/status", {}],
  };
  const out = {};
  for (const [name, [path, init]] of Object.entries(requests)) {
    try {
      const res = await fetch(base + path, init);
      const body = res.type === "opaque" ? "" : new TextDecoder().decode(await res.arrayBuffer());
      out[name] = { type: res.type, status: res.status, body, session: res.headers.get("Mcp-Session-Id") };
    } catch (err) {
      out[name] = { error: String(err) };
    }
  }
  return out;
}

// requestIDs runs in the page: it calls Connect and POST /run on the edge
// at base, each with its own X-Request-Id, and returns what the page read
// back of each answer.
async function requestIDs({ base, executePath }) {
  const body = JSON.stringify({ language: "python", code: "print(1)" });
  const out = {};
  for (const [name, path] of Object.entries({ connect: executePath, run: "/run" })) {
    const id = `page-${name}-0123`;
    try {
      const res = await fetch(base + path, { method: "POST", headers: { "Content-Type": "application/json", "X-Request-Id": id }, body });
      out[name] = { status: res.status, sent: id, got: res.headers.get("X-Request-Id") };
    } catch (err) {
      out[name] = { error: String(err) };
    }
  }
  return out;
}

describe("pages of other origins", { timeout: 120000 }, () => {
  const edge = edgeURL();
  const allowing = new URL(process.env.CODEMODE_ALLOWING_EDGE_URL ?? "");
  const port = Number(process.env.CODEMODE_PAGE_PORT);
  const pageURL = `http://127.0.0.1:${port}/`;
  let browser, page, server;

  before(async () => {
    assert.ok(process.env.CODEMODE_EDGE_METRICS_URL, "CODEMODE_EDGE_METRICS_URL is not set");
    assert.ok(port > 0, "CODEMODE_PAGE_PORT is not set");
    assert.equal(allowing.hostname, "127.0.0.1");
    server = createServer((req, res) => {
      res.writeHead(200, { "Content-Type": "text/html" });
      res.end("<!doctype html><title>another origin</title><p>a page the edge did not serve</p>");
    });
    await new Promise((resolve, reject) => server.once("error", reject).listen(port, "127.0.0.1", resolve));
    browser = await launch({ rebound: [rebound] });
    page = browser.page;
  });

  after(async () => {
    await browser?.close();
    await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
  });

  test("get nothing back from any door, and run nothing", async () => {
    const before = await executions();
    await page.goto(pageURL);
    const got = await page.evaluate(attempts, { base: edge.origin, code, executePath });
    for (const [name, r] of Object.entries(got)) {
      // A CORS request fails as a network error; a no-cors one gives an
      // opaque answer the page cannot read.
      assert.ok(r.error?.startsWith("TypeError") || (r.type === "opaque" && r.status === 0 && r.body === ""), `${name}: ${JSON.stringify(r)}`);
    }
    assert.equal(await executions(), before, "executions reached the edge");
  });

  test("at a host name rebound to the edge, get 403 and run nothing", async () => {
    const before = await executions();
    const res = await page.goto(`http://${rebound}:${edge.port}/`);
    assert.equal(res.status(), 403, "the playground under a rebound name");
    // The page is now of the rebound origin: to the browser its requests
    // to the edge are same-origin.
    const got = await page.evaluate(attempts, { base: "", code, executePath });
    for (const [name, r] of Object.entries(got)) {
      assert.equal(r.status, 403, `${name}: ${JSON.stringify(r)}`);
      assert.doesNotMatch(r.body, /ran-here/, name);
    }
    assert.equal(await executions(), before, "executions reached the edge");
  });

  test("with --allowed-origins, the page runs code", async () => {
    await page.goto(pageURL);
    const got = await page.evaluate(attempts, { base: allowing.origin, code, executePath });
    assert.equal(got["connect json"].status, 200, JSON.stringify(got["connect json"]));
    assert.equal(JSON.parse(got["connect json"].body).result.stdout, "ran-here\n");
    assert.equal(got["grpc-web"].status, 200);
    assert.match(got["grpc-web"].body, /ran-here\n/);
    assert.equal(got["run json"].status, 200);
    assert.equal(JSON.parse(got["run json"].body).output, "ran-here\n");
    assert.equal(got["run text/plain"].status, 415, "a text/plain body does not run, whatever the origin");
    assert.equal(got["mcp initialize"].status, 200);
    assert.ok(got["mcp initialize"].session, "the page reads the MCP session id");
    assert.equal(got.status.status, 200);
  });

  test("with --allowed-origins, the page sends its own request id and reads it back", async () => {
    // A browser without interception: Playwright would answer the CORS
    // preflight itself, allowing any header, and the edge's answer would
    // not count (see browser.mjs).
    const plain = await launch({ intercept: false });
    let got;
    try {
      await plain.page.goto(pageURL);
      got = await plain.page.evaluate(requestIDs, { base: allowing.origin, executePath });
    } finally {
      await plain.close();
    }
    for (const [name, r] of Object.entries(got)) {
      assert.equal(r.status, 200, `${name}: ${JSON.stringify(r)}`);
      assert.equal(r.got, r.sent, `${name}: ${JSON.stringify(r)}`);
    }
  });

  test("the playground the edge serves runs code", async () => {
    const before = await executions();
    const errors = browser.pageErrors.length;
    await page.goto(edge.href);
    await page.waitForSelector("body[data-state=idle]", { timeout: 15000 });
    await page.selectOption("#language", "python");
    await page.fill("#code", code);
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    assert.equal(await page.textContent("#output"), "ran-here\n");
    // The edge counts a stream's execution just after its last message.
    let n = await executions();
    for (const deadline = Date.now() + 10000; n < before + 1 && Date.now() < deadline; n = await executions()) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal(n, before + 1);
    assert.deepEqual(browser.pageErrors.slice(errors), []);
  });

  test("made no request off loopback", () => {
    assert.deepEqual(browser.offLoopback, []);
  });
});
