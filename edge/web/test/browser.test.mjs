// The playground in a real browser: Debian's Chromium, driven by
// playwright-core, loads the page from the edge and runs code over gRPC-Web.
// The browser reaches loopback only (see browser.mjs).

import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { launch } from "./browser.mjs";
import { edgeURL } from "./edge.mjs";

describe("playground", { timeout: 120000 }, () => {
  const url = edgeURL();
  let browser, page;

  before(async () => {
    browser = await launch();
    page = browser.page;
  });

  after(async () => {
    await browser?.close();
  });

  test("loads and lists the languages", async () => {
    const rpc = page.waitForRequest((r) => r.url().endsWith("/codemode.edge.v1.ExecutionService/ListLanguages"));
    const res = await page.goto(url.href);
    assert.equal((await rpc).headers()["content-type"], "application/grpc-web+proto", "the page speaks gRPC-Web");
    assert.equal(res.status(), 200);
    assert.match(res.headers()["content-security-policy"], /connect-src 'self'/);
    await page.waitForSelector("body[data-state=idle]", { timeout: 15000 });
    const languages = await page.$$eval("#language option", (os) => os.map((o) => o.value));
    assert.ok(languages.includes("python"), `languages: ${languages}`);
    assert.equal(await page.textContent("#conn"), "connected");
  });

  test("starts on the API's default language, python, with its example", async () => {
    // A fresh profile: nothing picked before. The first language the agents
    // list is not python, so this is the default and not the first entry.
    assert.equal(await page.inputValue("#language"), "python");
    assert.match(await page.inputValue("#code"), /print\(/);
  });

  test("runs python: print(6*7) shows 42", async () => {
    await page.selectOption("#language", "python");
    await page.fill("#code", "print(6*7)");
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    assert.equal(await page.textContent("#output"), "42\n");
    assert.equal(await page.textContent("#exit-code"), "exit 0");
    assert.match(await page.textContent("#duration"), /^\d+(\.\d+)? m?s$/);
  });

  test("streams output as it is written, stderr apart, with Ctrl+Enter", async () => {
    await page.fill(
      "#code",
      [
        "import sys, time",
        "for i in range(3):",
        "    print(f'line {i}', flush=True)",
        "    time.sleep(1)",
        "print('bye', file=sys.stderr)",
        "sys.exit(3)",
      ].join("\n"),
    );
    await page.focus("#code");
    await page.keyboard.press("Control+Enter");
    // The first line must be on screen while the program still runs...
    await page.waitForFunction(
      () => document.body.dataset.state === "running" && document.getElementById("output").textContent.includes("line 0"),
      null,
      { timeout: 15000, polling: 50 },
    );
    const firstSeen = Date.now();
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    // ...and the run goes on for about two more seconds after it.
    const rest = Date.now() - firstSeen;
    assert.ok(rest >= 1500, `the first line arrived only ${rest} ms before the end: output is not streamed`);
    assert.equal(await page.textContent("#output"), "line 0\nline 1\nline 2\nbye\n");
    assert.equal(await page.textContent("#output .err"), "bye\n");
    assert.equal(await page.textContent("#exit-code"), "exit 3");
    assert.match(await page.getAttribute("#exit-code", "class"), /\bbad\b/);
    const shot = process.env.CODEMODE_SCREENSHOT ?? join(tmpdir(), "codemode-playground.png");
    await page.screenshot({ path: shot });
    console.log(`screenshot: ${shot}`);
  });

  test("shows a matplotlib figure inline and offers other files for download", async () => {
    await page.fill(
      "#code",
      [
        "import matplotlib.pyplot as plt",
        "plt.plot([1, 4, 2, 5], marker='o')",
        "plt.title('codemode artifact')",
        "plt.show()",
        "open('/workspace/outputs/data.csv', 'w').write('x,y\\n1,4\\n')",
        "print('plotted')",
      ].join("\n"),
    );
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 60000 });
    assert.equal(await page.textContent("#output"), "plotted\n");
    const img = await page.waitForSelector("#artifacts figure[data-name='figure-1.png'] img", { timeout: 5000 });
    // Decoded by the browser: a real image, not a broken one.
    const size = await img.evaluate(async (el) => {
      await el.decode();
      return { w: el.naturalWidth, h: el.naturalHeight, src: el.src };
    });
    assert.ok(size.w > 100 && size.h > 100, `figure is ${size.w}x${size.h}`);
    assert.match(size.src, /^blob:/);
    const csv = await page.waitForSelector("#artifacts figure[data-name='data.csv'] a[download]");
    assert.equal(await csv.getAttribute("download"), "data.csv");
    assert.equal(await page.$("#artifacts figure[data-name='data.csv'] img"), null, "a CSV is not shown as an image");
    const download = page.waitForEvent("download");
    await csv.click();
    const file = await download;
    assert.equal(file.suggestedFilename(), "data.csv");
    const shot = (process.env.CODEMODE_SCREENSHOT ?? join(tmpdir(), "codemode-playground.png")).replace(/(\.png)?$/, "-artifacts.png");
    await page.screenshot({ path: shot });
    console.log(`screenshot: ${shot}`);
    // The next run clears them.
    await page.fill("#code", "print(1)");
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    assert.equal(await page.isHidden("#artifacts"), true);
  });

  test("a run past its timeout is killed and says so", async () => {
    await page.fill("#timeout", "2");
    await page.fill("#code", "import time\nprint('start', flush=True)\ntime.sleep(20)");
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 15000 });
    assert.equal(await page.textContent("#output"), "start\n");
    assert.equal(await page.textContent("#timed-out"), "timed out");
    await page.fill("#timeout", "30");
  });

  test("a session keeps /workspace between runs", async () => {
    // The switch is a styled label around a visually hidden checkbox.
    await page.click("label.switch");
    assert.equal(await page.isChecked("#session"), true);
    await page.waitForSelector("#session-id:not([hidden])", { timeout: 15000 });
    const id = await page.textContent("#session-id");
    assert.ok(id, "session id shown");
    await page.fill("#code", "open('/workspace/n', 'w').write('41')");
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    await page.fill("#code", "print(int(open('/workspace/n').read()) + 1)");
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    assert.equal(await page.textContent("#output"), "42\n");
    const closed = page.waitForResponse((r) => r.url().endsWith("/codemode.edge.v1.ExecutionService/CloseSession"));
    await page.click("label.switch");
    const res = await closed;
    // gRPC-Web answers 200 and puts the status in the trailers: the page
    // shows a failed close as a note in the output.
    assert.equal(res.status(), 200);
    await page.waitForSelector("#session-id", { state: "hidden" });
    assert.equal(await page.isChecked("#session"), false);
    assert.doesNotMatch(await page.textContent("#output"), /session:/);
  });

  test("made no request off loopback and logged no error", () => {
    assert.deepEqual(browser.offLoopback, []);
    assert.deepEqual(browser.pageErrors, []);
  });
});
