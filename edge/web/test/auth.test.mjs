// An edge that requires API keys (CODEMODE_EDGE_URL, key in CODEMODE_API_KEY):
// the playground asks for the key and then runs code; MCP clients without the
// key are turned away and with it are served.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { launch } from "./browser.mjs";
import { edgeURL } from "./edge.mjs";

const key = process.env.CODEMODE_API_KEY;

describe("edge with API keys", { timeout: 60000 }, () => {
  const url = edgeURL();
  assert.ok(key, "CODEMODE_API_KEY is not set");

  describe("playground", () => {
    let browser, page;
    before(async () => {
      browser = await launch();
      page = browser.page;
    });
    after(async () => {
      await browser?.close();
    });

    test("says it needs a key, then runs code with one", async () => {
      await page.goto(url.href);
      await page.waitForSelector("body[data-state=error]");
      assert.match(await page.textContent("#conn"), /unauthenticated: enter an API key/);
      assert.equal(await page.isDisabled("#run"), true);

      const listed = () => page.waitForResponse((r) => r.url().endsWith("/codemode.edge.v1.ExecutionService/ListLanguages"));
      await page.fill("#api-key", "not-the-key-0123456789");
      let res = listed();
      await page.press("#api-key", "Enter"); // a change event: the page tries again
      await res;
      await page.waitForFunction(() => /unauthenticated/.test(document.getElementById("conn").textContent));
      assert.equal(await page.getAttribute("body", "data-state"), "error");

      await page.fill("#api-key", key);
      res = listed();
      await page.press("#api-key", "Tab");
      await res;
      await page.waitForSelector("body[data-state=idle]");
      assert.equal(await page.textContent("#conn"), "connected");

      await page.selectOption("#language", "python");
      await page.fill("#code", "print(6*7)");
      await page.click("#run");
      await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
      assert.equal(await page.textContent("#output"), "42\n");

      // The key survives a reload of the tab.
      await page.reload();
      await page.waitForSelector("body[data-state=idle]");
      assert.deepEqual(browser.offLoopback, []);
      assert.deepEqual(browser.pageErrors, []);
    });
  });

  describe("MCP", () => {
    test("without the key the connection is refused", async () => {
      const client = new Client({ name: "codemode-web-test", version: "0.1.0" });
      await assert.rejects(client.connect(new StreamableHTTPClientTransport(new URL("/mcp", url))), /401|unauthori[sz]ed|API key/i);
    });

    test("with the key execute_code runs", async () => {
      const client = new Client({ name: "codemode-web-test", version: "0.1.0" });
      await client.connect(
        new StreamableHTTPClientTransport(new URL("/mcp", url), {
          requestInit: { headers: { Authorization: `Bearer ${key}` } },
        }),
      );
      try {
        const res = await client.callTool({ name: "execute_code", arguments: { language: "python", code: "print(6*7)" } });
        assert.notEqual(res.isError, true);
        assert.equal(res.structuredContent.stdout, "42\n");
      } finally {
        await client.close();
      }
    });
  });
});
