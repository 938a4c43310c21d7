// Launches Debian's Chromium for the browser tests, fenced to loopback.
//
// The browser may reach loopback only: Playwright aborts every request to
// another host (and records it, for the tests to assert there were none); the
// proxy setting sends anything that escapes the interception to a closed
// loopback port (loopback itself bypasses proxies); every other host name is
// unresolvable; and background services (updates, sync, safe browsing,
// metrics, QUIC) are switched off. Each launch gets a fresh profile.
//
// launch({ rebound: ["rebind.test"] }) resolves those names to 127.0.0.1, as
// a DNS rebinding attack would after its first answer: the browser still
// reaches loopback only.

import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const loopback = new Set(["127.0.0.1", "localhost", "[::1]"]);

const baseArgs = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-quic",
  "--no-first-run",
  "--no-pings",
  "--disable-domain-reliability",
  "--disable-client-side-phishing-detection",
  "--disable-features=OptimizationHints,MediaRouter,Translate,NetworkTimeServiceQuerying,CertificateTransparencyComponentUpdater",
  "--metrics-recording-only",
  "--proxy-server=http://127.0.0.1:9",
];

function args(rebound) {
  const map = rebound.map((name) => `MAP ${name} 127.0.0.1, `).join("");
  const out = [...baseArgs, `--host-resolver-rules=${map}MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1`];
  // An edge serving HTTPS with a certificate of a test's own CA: Chromium
  // trusts a chain holding a certificate whose key is in CHROMIUM_TRUST_SPKI
  // (base64 SHA-256 of the key), and ignores no other certificate error.
  if (process.env.CHROMIUM_TRUST_SPKI) out.push(`--ignore-certificate-errors-spki-list=${process.env.CHROMIUM_TRUST_SPKI}`);
  if (rebound.length > 0) out.push(`--proxy-bypass-list=${rebound.join(";")}`);
  return out;
}

// launch starts the browser with one page. offLoopback lists the requests
// that were aborted for leaving loopback; pageErrors the page's uncaught
// errors and console errors.
//
// With intercept false there is no interception, and offLoopback stays
// empty: the other fences still hold. Playwright answers CORS preflights
// itself, allowing everything, while it intercepts requests; a test of what
// the server's own preflight answer allows needs intercept false.
export async function launch({ rebound = [], intercept = true } = {}) {
  const allowed = new Set([...loopback, ...rebound]);
  const profile = await mkdtemp(join(tmpdir(), "codemode-chromium-"));
  const offLoopback = [];
  const pageErrors = [];
  let context;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath,
      headless: true,
      args: args(rebound),
      viewport: { width: 1280, height: 760 },
      serviceWorkers: "block",
    });
  } catch (err) {
    await rm(profile, { recursive: true, force: true });
    throw err;
  }
  context.setDefaultTimeout(15000);
  if (intercept) await context.route("**/*", (route) => {
    const u = new URL(route.request().url());
    if ((u.protocol === "http:" || u.protocol === "https:") && allowed.has(u.hostname)) return route.continue();
    offLoopback.push(u.href);
    return route.abort("blockedbyclient");
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  page.on("console", (msg) => {
    if (msg.type() === "error") pageErrors.push(msg.text());
  });
  return {
    page,
    offLoopback,
    pageErrors,
    async close() {
      await context.close();
      await rm(profile, { recursive: true, force: true });
    },
  };
}
