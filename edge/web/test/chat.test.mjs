// The playground's chat tab in Chromium, against an edge whose chat
// provider is a scripted model (CODEMODE_EDGE_URL, key in
// CODEMODE_API_KEY; edge/e2e's TestChat starts both): a question whose
// code prints, then plots; the output streams while the code runs, the
// plot is shown inline, the answer and the tokens follow.

import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { launch } from "./browser.mjs";
import { edgeURL } from "./edge.mjs";

const key = process.env.CODEMODE_API_KEY;
// The scripted model's plot question (edge/e2e/chat_test.go).
const question = process.env.CODEMODE_CHAT_QUESTION;

describe("chat tab", { timeout: 90000 }, () => {
  const url = edgeURL();
  assert.ok(key, "CODEMODE_API_KEY is not set");
  assert.ok(question, "CODEMODE_CHAT_QUESTION is not set");
  let browser, page;

  before(async () => {
    browser = await launch();
    page = browser.page;
  });

  after(async () => {
    await browser?.close();
  });

  test("asks, streams the code's output, shows the plot inline and the answer", async () => {
    await page.goto(url.href);
    await page.fill("#api-key", key);
    await page.press("#api-key", "Enter");
    await page.waitForSelector("body[data-state=idle]");
    await page.click("#tab-chat");
    assert.equal(await page.isVisible("#chat-view"), true);
    assert.equal(await page.isHidden("#code-view"), true);
    assert.equal(await page.inputValue("#door"), "code");

    const rpc = page.waitForRequest((r) => r.url().endsWith("/codemode.edge.v1.ChatService/Chat"));
    await page.fill("#chat-input", question);
    await page.press("#chat-input", "Enter");
    assert.equal((await rpc).headers()["content-type"], "application/grpc-web+proto");
    // The code's first line is on screen while the conversation goes on.
    await page.waitForFunction(
      () => document.getElementById("chat-view").dataset.chatState === "running" &&
        document.querySelector(".tool[data-name=execute_code] .tool-output")?.textContent.includes("plotting"),
      null,
      { timeout: 30000, polling: 50 },
    ).catch(async (err) => {
      throw new Error(`${err.message}; the chat shows: ${await page.innerHTML("#chat-view")}`);
    });
    assert.equal(await page.isDisabled("#door"), true, "the door is fixed for the conversation");
    await page.waitForSelector("#chat-view[data-chat-state=done]", { timeout: 60000 });

    assert.match(await page.textContent(".msg.user"), /Plot/);
    assert.match(await page.textContent(".tool[data-name=execute_code] .tool-code"), /plt\.show\(\)/);
    assert.equal(await page.textContent(".tool[data-name=execute_code] .tool-state"), "done");
    const img = await page.waitForSelector(".tool .artifacts figure img", { timeout: 5000 });
    const size = await img.evaluate(async (el) => {
      await el.decode();
      return { w: el.naturalWidth, h: el.naturalHeight, src: el.src };
    });
    assert.ok(size.w > 100 && size.h > 100, `the plot is ${size.w}x${size.h}`);
    assert.match(size.src, /^blob:/);
    const answers = await page.$$eval(".msg.assistant", (els) => els.map((e) => e.textContent));
    assert.ok(answers.some((a) => a.includes("The tool answered: plotting")), `answers: ${answers}`);
    assert.match(await page.textContent("#chat-done"), /^2 turns, 1 tool call, \d+ in \/ \d+ out tokens/);
    assert.match(await page.textContent("#chat-usage"), /^\d+ in \/ \d+ out tokens$/);
    const shot = process.env.CODEMODE_SCREENSHOT ?? join(tmpdir(), "codemode-chat.png");
    await page.screenshot({ path: shot });
    console.log(`screenshot: ${shot}`);

    // A new chat starts empty, its door free again.
    await page.click("#chat-new");
    assert.equal(await page.$$eval(".msg", (els) => els.length), 0);
    assert.equal(await page.isDisabled("#door"), false);
  });

  test("made no request off loopback and logged no error", () => {
    assert.deepEqual(browser.offLoopback, []);
    assert.deepEqual(browser.pageErrors, []);
  });
});
