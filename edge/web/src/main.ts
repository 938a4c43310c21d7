// The codemode playground: edit code, run it on the edge over gRPC-Web, and
// watch stdout and stderr stream in.
//
// The page calls the ExecutionService of the origin that served it (the
// edge), with the generated types of proto/codemode/edge/v1. It keeps no
// state on the server beyond an optional session, which it closes when the
// toggle is switched off.

import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { create } from "@bufbuild/protobuf";
import { type Duration, DurationSchema } from "@bufbuild/protobuf/wkt";
import { ExecutionService } from "./gen/codemode/edge/v1/edge_pb";
import type { Artifact, Result } from "./gen/codemode/execution/v1/execution_pb";
import { setupChat } from "./chat";
import * as signIn from "./signin";

// Examples shown when a language is picked and the editor holds no edits.
const examples: Record<string, string> = {
  python: `import sys, time

for i in range(3):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
print("done", file=sys.stderr)
`,
  javascript: `const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

for (let i = 0; i < 3; i++) {
  console.log(\`tick \${i}\`);
  await sleep(500);
}
console.error("done on", process.version);
`,
  bash: `echo "hello from bash $BASH_VERSION"
for i in 1 2 3; do echo "tick $i"; sleep 0.5; done
echo "done" >&2
`,
  sh: `echo "hello from sh"
uname -a
echo "done" >&2
`,
  c: `#include <stdio.h>

int main(void) {
  for (int i = 0; i < 3; i++) printf("tick %d\\n", i);
  fprintf(stderr, "done\\n");
  return 0;
}
`,
  cpp: `#include <iostream>
#include <vector>

int main() {
  std::vector<int> v{3, 1, 2};
  for (int x : v) std::cout << "tick " << x << std::endl;
  std::cerr << "done" << std::endl;
}
`,
  ruby: `3.times { |i| puts "tick #{i}"; sleep 0.5 }
warn "done on ruby #{RUBY_VERSION}"
`,
  perl: `for my $i (0..2) { print "tick $i\\n"; }
print STDERR "done\\n";
`,
  php: `<?php
for ($i = 0; $i < 3; $i++) echo "tick $i\\n";
fwrite(STDERR, "done on PHP " . PHP_VERSION . "\\n");
`,
  lua: `for i = 0, 2 do print("tick " .. i) end
io.stderr:write("done on " .. _VERSION .. "\\n")
`,
};

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const ui = {
  conn: $<HTMLSpanElement>("conn"),
  apiKey: $<HTMLInputElement>("api-key"),
  signIn: $<HTMLButtonElement>("sign-in"),
  language: $<HTMLSelectElement>("language"),
  session: $<HTMLInputElement>("session"),
  sessionId: $<HTMLElement>("session-id"),
  timeout: $<HTMLInputElement>("timeout"),
  run: $<HTMLButtonElement>("run"),
  code: $<HTMLTextAreaElement>("code"),
  badges: $<HTMLSpanElement>("badges"),
  duration: $<HTMLSpanElement>("duration"),
  clear: $<HTMLButtonElement>("clear"),
  output: $<HTMLPreElement>("output"),
  artifacts: $<HTMLDivElement>("artifacts"),
};

// The API key lives in sessionStorage: it survives a reload, not the tab.
const keyStore = "codemode.apiKey";
ui.apiKey.value = sessionStorage.getItem(keyStore) ?? "";
ui.apiKey.addEventListener("change", () => {
  sessionStorage.setItem(keyStore, ui.apiKey.value.trim());
  // Not connected yet, or refused: try again with the key (a load still
  // under way is superseded).
  if (ui.conn.dataset.state !== "ok") void loadLanguages();
});

// A signed-in user's token goes before a key.
const auth: Interceptor = (next) => (req) => {
  const bearer = signIn.token() ?? ui.apiKey.value.trim();
  if (bearer !== "") req.header.set("Authorization", `Bearer ${bearer}`);
  return next(req);
};

// The edge serves this page next to its API, so the API is at the page's base.
const transport = createGrpcWebTransport({
  baseUrl: new URL(".", document.baseURI).href.replace(/\/$/, ""),
  interceptors: [auth],
});
const client = createClient(ExecutionService, transport);

type State = "loading" | "idle" | "running" | "done" | "error";
function setState(s: State) {
  document.body.dataset.state = s;
}

function describe(err: unknown): string {
  if (err instanceof ConnectError) {
    if (err.code === Code.Unauthenticated) return ui.signIn.hidden ? "unauthenticated: enter an API key above" : "unauthenticated: sign in or enter an API key above";
    return `${Code[err.code] ?? "error"}: ${err.rawMessage}`;
  }
  return err instanceof Error ? err.message : String(err);
}

// ---- languages ----

// loads counts loadLanguages calls: only the latest may set the page's state.
let loads = 0;

async function loadLanguages() {
  const load = ++loads;
  ui.conn.dataset.state = "";
  ui.conn.textContent = "connecting…";
  try {
    const res = await client.listLanguages({}, { timeoutMs: 15000 });
    if (load !== loads) return;
    const prev = ui.language.value;
    ui.language.replaceChildren(
      ...res.languages.map((l) => {
        const o = document.createElement("option");
        o.value = l.name;
        o.textContent = l.version ? `${l.name} ${l.version}` : l.name;
        return o;
      }),
    );
    if (res.languages.length === 0) throw new Error("no languages available");
    // The language picked before, else the one picked last time here, else
    // the agents' default (what the API runs when a request names none).
    const has = (name: string | null | undefined) => !!name && res.languages.some((l) => l.name === name);
    const stored = localStorage.getItem("codemode.language");
    const fallback = res.defaults?.language;
    ui.language.value = has(prev) ? prev : has(stored) ? stored! : has(fallback) ? fallback! : res.languages[0].name;
    ui.language.disabled = false;
    ui.session.disabled = false;
    ui.run.disabled = false;
    ui.conn.dataset.state = "ok";
    ui.conn.textContent = "connected";
    if (ui.code.value === "" || isExample(ui.code.value)) setExample();
    setState("idle");
  } catch (err) {
    if (load !== loads) return;
    ui.conn.dataset.state = "error";
    ui.conn.textContent = describe(err);
    ui.conn.title = ui.conn.textContent;
    setState("error");
  }
}

function isExample(code: string) {
  return Object.values(examples).includes(code);
}

function setExample() {
  ui.code.value = examples[ui.language.value] ?? "";
}

ui.language.addEventListener("change", () => {
  localStorage.setItem("codemode.language", ui.language.value);
  if (ui.code.value === "" || isExample(ui.code.value)) setExample();
});

// ---- sessions ----

let sessionId = "";

ui.session.addEventListener("change", async () => {
  ui.session.disabled = true;
  try {
    if (ui.session.checked) {
      const res = await client.createSession({ language: ui.language.value });
      sessionId = res.session?.id ?? "";
      ui.sessionId.textContent = sessionId;
      ui.sessionId.title = `session ${sessionId} on ${res.session?.agent ?? "?"}`;
      ui.sessionId.hidden = false;
    } else {
      await closeSession();
    }
  } catch (err) {
    ui.session.checked = sessionId !== "";
    note(`session: ${describe(err)}`);
  } finally {
    ui.session.disabled = false;
  }
});

async function closeSession() {
  const id = sessionId;
  sessionId = "";
  ui.sessionId.hidden = true;
  ui.sessionId.textContent = "";
  if (id !== "") await client.closeSession({ sessionId: id });
}

// ---- output ----

let last: { kind: string; el: HTMLSpanElement } | null = null;

function write(kind: "out" | "err" | "sys", text: string) {
  if (text === "") return;
  const o = ui.output;
  const atBottom = o.scrollHeight - o.scrollTop - o.clientHeight < 24;
  if (last === null || last.kind !== kind) {
    const el = document.createElement("span");
    if (kind !== "out") el.className = kind;
    o.append(el);
    last = { kind, el };
  }
  last.el.append(text);
  if (atBottom) o.scrollTop = o.scrollHeight;
}

function note(text: string) {
  const o = ui.output;
  if (o.textContent !== "" && !o.textContent!.endsWith("\n")) write("sys", "\n");
  write("sys", `${text}\n`);
}

function clearOutput() {
  ui.output.replaceChildren();
  clearArtifacts();
  ui.badges.replaceChildren();
  ui.duration.textContent = "";
  last = null;
}

function badge(text: string, kind: "ok" | "bad" | "warn" | "run" | "" = "") {
  const b = document.createElement("span");
  b.className = `badge ${kind}`.trim();
  b.textContent = text;
  ui.badges.append(b);
  return b;
}

function millis(d: Duration | undefined): number {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0;
}

function formatMillis(ms: number): string {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function showResult(r: Result) {
  ui.badges.replaceChildren();
  const b = badge(`exit ${r.exitCode}`, r.exitCode === 0 ? "ok" : "bad");
  b.id = "exit-code";
  if (r.timedOut) badge("timed out", "warn").id = "timed-out";
  if (r.truncated) badge("truncated", "warn").id = "truncated";
  if (r.oomKilled) badge("out of memory", "bad").id = "oom-killed";
  ui.duration.textContent = formatMillis(millis(r.duration));
  ui.duration.title = r.agent ? `ran on ${r.agent}` : "";
  showArtifacts(r.artifacts, r.artifactsTruncated);
}

// ---- artifacts ----

// Shown inline: raster images only. Anything else, SVG included (a document
// that could script in this origin if opened), is offered for download as
// bytes.
const inlineImages = new Set(["image/png", "image/jpeg", "image/gif", "image/webp", "image/avif"]);

// Object URLs of the artifacts shown, revoked when they go away.
let artifactURLs: string[] = [];

function clearArtifacts() {
  for (const u of artifactURLs) URL.revokeObjectURL(u);
  artifactURLs = [];
  ui.artifacts.replaceChildren();
  ui.artifacts.hidden = true;
}

function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1 << 20)).toFixed(1)} MiB`;
}

function showArtifacts(artifacts: Artifact[], truncated: boolean) {
  clearArtifacts();
  if (artifacts.length === 0 && !truncated) return;
  for (const a of artifacts) {
    const type = a.mediaType.split(";")[0].trim().toLowerCase();
    const inline = inlineImages.has(type);
    const url = URL.createObjectURL(new Blob([a.content as Uint8Array<ArrayBuffer>], { type: inline ? type : "application/octet-stream" }));
    artifactURLs.push(url);
    const fig = document.createElement("figure");
    fig.className = "artifact";
    fig.dataset.name = a.name;
    if (inline) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = a.name;
      fig.append(img);
    }
    const cap = document.createElement("figcaption");
    const link = document.createElement("a");
    link.href = url;
    link.download = a.name.split("/").pop() || "artifact";
    link.textContent = a.name;
    link.title = `Download ${a.name}`;
    const meta = document.createElement("span");
    meta.className = "muted";
    meta.textContent = ` ${a.mediaType.split(";")[0]}, ${formatBytes(Number(a.size))}`;
    cap.append(link, meta);
    fig.append(cap);
    ui.artifacts.append(fig);
  }
  if (truncated) {
    const p = document.createElement("p");
    p.className = "muted";
    p.id = "artifacts-truncated";
    p.textContent = "More files were left in /workspace/outputs than a result carries; some are not shown.";
    ui.artifacts.append(p);
  }
  ui.artifacts.hidden = false;
}

ui.clear.addEventListener("click", clearOutput);

// ---- running ----

// timeout returns the limit typed in, clamped to what the API accepts.
function timeout(): Duration | undefined {
  const s = Math.round(Number(ui.timeout.value));
  if (!Number.isFinite(s) || s <= 0) return undefined;
  const clamped = Math.min(s, 300);
  ui.timeout.value = String(clamped);
  return create(DurationSchema, { seconds: BigInt(clamped) });
}

let running: AbortController | null = null;

async function run() {
  if (running) {
    running.abort();
    return;
  }
  const code = ui.code.value;
  if (code.trim() === "" || ui.run.disabled) return;
  const ctl = new AbortController();
  running = ctl;
  clearOutput();
  setState("running");
  ui.run.dataset.running = "";
  ui.run.querySelector(".label")!.textContent = "Stop";
  badge("running", "run");
  const started = performance.now();
  const tick = setInterval(() => {
    ui.duration.textContent = formatMillis(performance.now() - started);
  }, 100);
  let result: Result | undefined;
  try {
    const stream = client.executeStream(
      { language: ui.language.value, code, sessionId, timeout: timeout() },
      { signal: ctl.signal },
    );
    for await (const res of stream) {
      const ev = res.event?.event;
      switch (ev?.case) {
        case "stdout":
          write("out", ev.value);
          break;
        case "stderr":
          write("err", ev.value);
          break;
        case "result":
          result = ev.value;
          break;
      }
    }
    clearInterval(tick);
    if (result === undefined) throw new Error("the stream ended without a result");
    showResult(result);
    setState("done");
  } catch (err) {
    clearInterval(tick);
    ui.badges.replaceChildren();
    if (ctl.signal.aborted) {
      badge("stopped", "warn");
      note("stopped");
    } else {
      badge("error", "bad");
      note(describe(err));
    }
    ui.duration.textContent = formatMillis(performance.now() - started);
    setState("error");
  } finally {
    running = null;
    delete ui.run.dataset.running;
    ui.run.querySelector(".label")!.textContent = "Run";
  }
}

ui.run.addEventListener("click", () => void run());

document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    void run();
  }
});

// Tab indents in the editor; Escape leaves it so Tab can move focus again.
ui.code.addEventListener("keydown", (e) => {
  if (e.key === "Escape") {
    ui.code.blur();
  } else if (e.key === "Tab" && !e.shiftKey && !e.ctrlKey && !e.metaKey && !e.altKey) {
    e.preventDefault();
    const indent = ui.language.value === "python" ? "    " : "  ";
    // execCommand keeps the edit on the textarea's undo stack.
    if (!document.execCommand("insertText", false, indent)) ui.code.setRangeText(indent, ui.code.selectionStart, ui.code.selectionEnd, "end");
  }
});

// With a provider to sign in with, the page offers it, and finishes a
// sign-in the provider sent it back from before it connects.
async function start() {
  const s = await signIn.settings();
  if (s) {
    const signedIn = () => {
      const on = signIn.token() !== undefined;
      ui.signIn.textContent = on ? "Sign out" : "Sign in";
      ui.signIn.dataset.signedIn = on ? "true" : "false";
    };
    ui.signIn.hidden = false;
    ui.signIn.addEventListener("click", () => {
      if (signIn.token() !== undefined) {
        signIn.signOut();
        signedIn();
        void loadLanguages();
      } else {
        void signIn.start(s);
      }
    });
    try {
      await signIn.finish(s);
    } catch (err) {
      ui.conn.dataset.state = "error";
      ui.conn.textContent = describe(err);
    }
    signedIn();
  }
  await loadLanguages();
}

setupChat(transport, describe);
void start();
