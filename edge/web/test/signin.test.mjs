// An edge that trusts an OpenID provider with a client for the playground
// (CODEMODE_EDGE_URL; the provider runs on loopback in the Go test that
// starts this one): the playground offers sign-in, the user goes through
// the provider (authorization code with PKCE, in Chromium; the provider's
// login signs its test user in at once), comes back signed in, and runs
// code with the token, sent over gRPC-Web.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { launch } from "./browser.mjs";
import { edgeURL } from "./edge.mjs";

const issuer = process.env.CODEMODE_OAUTH_ISSUER;

describe("playground sign-in", { timeout: 60000 }, () => {
  const url = edgeURL();
  assert.ok(issuer, "CODEMODE_OAUTH_ISSUER is not set");
  let browser, page;
  before(async () => {
    browser = await launch();
    page = browser.page;
  });
  after(async () => {
    await browser?.close();
  });

  test("signs in through the provider, then runs code", async () => {
    await page.goto(url.href);
    await page.waitForSelector("body[data-state=error]");
    assert.match(await page.textContent("#conn"), /unauthenticated: sign in/);
    assert.equal(await page.textContent("#sign-in"), "Sign in");

    const providerSeen = page.waitForRequest((r) => r.url().startsWith(`${issuer}/authorize`));
    await page.click("#sign-in");
    const authorize = new URL((await providerSeen).url());
    assert.equal(authorize.searchParams.get("code_challenge_method"), "S256");
    assert.equal(authorize.searchParams.get("resource"), url.origin);
    await page.waitForSelector("body[data-state=idle]", { timeout: 30000 });
    assert.equal(await page.textContent("#conn"), "connected");
    assert.equal(await page.textContent("#sign-in"), "Sign out");
    assert.equal(new URL(page.url()).search, "", "the code stays in the address bar");

    const stored = await page.evaluate(() => sessionStorage.getItem("codemode.token"));
    const claims = JSON.parse(Buffer.from(JSON.parse(stored).accessToken.split(".")[1], "base64url").toString());
    assert.equal(claims.iss, issuer);

    await page.selectOption("#language", "python");
    await page.fill("#code", "print(6*7)");
    await page.click("#run");
    await page.waitForSelector("body[data-state=done]", { timeout: 30000 });
    assert.equal(await page.textContent("#output"), "42\n");

    // Signed out, the edge refuses again.
    await page.click("#sign-in");
    await page.waitForSelector("body[data-state=error]");
    assert.deepEqual(browser.offLoopback, []);
  });
});
