// The playground's chat tab: a question goes to the edge's ChatService,
// whose model answers with codemode's own tools; the page shows the
// model's text as it comes, each tool call with its code or arguments, the
// code's output streaming, the result, plots inline, and the tokens used.
// The door (code or direct) is chosen per conversation.

import { createClient, type Transport } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import {
  ChatMessage_Role,
  ChatMessageSchema,
  ChatService,
  Door,
  Done_Reason,
  type ChatArtifact,
  type Done,
  type ToolCall,
  type ToolResult,
} from "./gen/codemode/edge/v1/chat_pb";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

// Shown inline: raster images only, as on the code tab.
const inlineImages = new Set(["image/png", "image/jpeg", "image/gif", "image/webp", "image/avif"]);

export function setupChat(transport: Transport, describe: (err: unknown) => string) {
  const client = createClient(ChatService, transport);
  const ui = {
    tabCode: $<HTMLButtonElement>("tab-code"),
    tabChat: $<HTMLButtonElement>("tab-chat"),
    codeView: $<HTMLElement>("code-view"),
    chatView: $<HTMLElement>("chat-view"),
    door: $<HTMLSelectElement>("door"),
    usage: $<HTMLSpanElement>("chat-usage"),
    newChat: $<HTMLButtonElement>("chat-new"),
    log: $<HTMLDivElement>("chat-log"),
    form: $<HTMLFormElement>("chat-form"),
    input: $<HTMLTextAreaElement>("chat-input"),
    send: $<HTMLButtonElement>("chat-send"),
  };

  // ---- tabs ----
  function show(chat: boolean) {
    ui.codeView.hidden = chat;
    ui.chatView.hidden = !chat;
    ui.tabCode.setAttribute("aria-selected", String(!chat));
    ui.tabChat.setAttribute("aria-selected", String(chat));
    if (chat) ui.input.focus();
    history.replaceState(null, "", chat ? "#chat" : location.pathname + location.search);
  }
  ui.tabCode.addEventListener("click", () => show(false));
  ui.tabChat.addEventListener("click", () => show(true));
  if (location.hash === "#chat") show(true);

  // ---- the conversation ----
  let messages: { role: ChatMessage_Role; text: string }[] = [];
  let urls: string[] = [];
  let running: AbortController | null = null;

  function setState(s: "idle" | "running" | "done" | "error") {
    ui.chatView.dataset.chatState = s;
  }

  function scroll() {
    ui.log.scrollTop = ui.log.scrollHeight;
  }

  function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text = ""): HTMLElementTagNameMap[K] {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text) e.textContent = text;
    return e;
  }

  function reset() {
    running?.abort();
    for (const u of urls) URL.revokeObjectURL(u);
    urls = [];
    messages = [];
    ui.log.replaceChildren();
    ui.usage.textContent = "";
    ui.door.disabled = false;
    setState("idle");
  }
  ui.newChat.addEventListener("click", reset);

  function toolBlock(call: ToolCall): HTMLElement {
    const box = el("details", "tool");
    box.open = true;
    box.dataset.id = call.id;
    box.dataset.name = call.name;
    const sum = el("summary", "", "");
    sum.append(el("span", "tool-name", call.name), el("span", "tool-state badge run", "running"));
    box.append(sum);
    let args: Record<string, unknown> = {};
    try {
      args = JSON.parse(call.arguments || "{}");
    } catch {
      // shown as written
    }
    if (typeof args.code === "string") {
      const lang = typeof args.language === "string" ? args.language : "";
      box.append(el("div", "tool-label muted", lang ? `code (${lang})` : "code"), el("pre", "tool-code", args.code));
    } else {
      box.append(el("pre", "tool-args", call.arguments));
    }
    box.append(el("div", "tool-label muted", "output"), el("pre", "tool-output"));
    return box;
  }

  function showResult(box: HTMLElement, r: ToolResult) {
    const state = box.querySelector(".tool-state")!;
    state.className = `tool-state badge ${r.isError ? "bad" : "ok"}`;
    state.textContent = r.isError ? "error" : "done";
    const out = box.querySelector<HTMLPreElement>(".tool-output")!;
    // The result has the whole output; what streamed may have been cut.
    out.textContent = r.text;
    if (r.isError) out.classList.add("err");
    if (r.artifacts.length > 0) box.append(artifacts(r.artifacts));
  }

  function artifacts(list: ChatArtifact[]): HTMLElement {
    const div = el("div", "artifacts");
    for (const a of list) {
      const type = a.mediaType.split(";")[0].trim().toLowerCase();
      const inline = inlineImages.has(type);
      const url = URL.createObjectURL(new Blob([a.content as Uint8Array<ArrayBuffer>], { type: inline ? type : "application/octet-stream" }));
      urls.push(url);
      const fig = el("figure", "artifact");
      fig.dataset.name = a.name;
      if (inline) {
        const img = el("img", "");
        img.src = url;
        img.alt = a.name;
        fig.append(img);
      }
      const cap = el("figcaption", "");
      const link = el("a", "", a.name || "artifact");
      link.href = url;
      link.download = a.name.split("/").pop() || "artifact";
      cap.append(link);
      fig.append(cap);
      div.append(fig);
    }
    return div;
  }

  function doneText(d: Done): string {
    const secs = d.duration ? Number(d.duration.seconds) + d.duration.nanos / 1e9 : 0;
    return `${d.turns} turn${d.turns === 1 ? "" : "s"}, ${d.toolCalls} tool call${d.toolCalls === 1 ? "" : "s"}, ` +
      `${d.inputTokens} in / ${d.outputTokens} out tokens, ${secs.toFixed(1)} s`;
  }

  async function ask() {
    if (running) {
      running.abort();
      return;
    }
    const question = ui.input.value.trim();
    if (question === "") return;
    ui.input.value = "";
    ui.log.querySelector(".hint")?.remove();
    ui.door.disabled = true;
    messages.push({ role: ChatMessage_Role.USER, text: question });
    ui.log.append(el("div", "msg user", question));
    let answer: HTMLElement | null = null; // the model's text of this turn
    const boxes = new Map<string, HTMLElement>();
    let tokensIn = 0n, tokensOut = 0n;
    const ctl = new AbortController();
    running = ctl;
    setState("running");
    ui.send.dataset.running = "";
    ui.send.querySelector(".label")!.textContent = "Stop";
    let done: Done | undefined;
    try {
      const stream = client.chat(
        {
          door: ui.door.value === "direct" ? Door.DIRECT : Door.CODE,
          messages: messages.map((m) => create(ChatMessageSchema, m)),
        },
        { signal: ctl.signal },
      );
      for await (const res of stream) {
        const ev = res.event;
        switch (ev.case) {
          case "text":
            if (answer === null) {
              answer = el("div", "msg assistant");
              ui.log.append(answer);
            }
            answer.append(ev.value);
            break;
          case "toolCall": {
            answer = null;
            const box = toolBlock(ev.value);
            boxes.set(ev.value.id, box);
            ui.log.append(box);
            break;
          }
          case "toolOutput":
            boxes.get(ev.value.id)?.querySelector(".tool-output")?.append(ev.value.text);
            break;
          case "toolResult": {
            const box = boxes.get(ev.value.id);
            if (box) showResult(box, ev.value);
            answer = null;
            break;
          }
          case "usage":
            tokensIn += ev.value.inputTokens;
            tokensOut += ev.value.outputTokens;
            ui.usage.textContent = `${tokensIn} in / ${tokensOut} out tokens`;
            break;
          case "done":
            done = ev.value;
            break;
        }
        scroll();
      }
      if (!done) throw new Error("the stream ended without its end");
      if (done.answer !== "") messages.push({ role: ChatMessage_Role.ASSISTANT, text: done.answer });
      const end = el("div", `msg end${done.reason === Done_Reason.ANSWERED ? "" : " warn"}`);
      end.id = "chat-done";
      if (done.reason !== Done_Reason.ANSWERED) end.append(el("strong", "", done.message), " · ");
      end.append(doneText(done));
      ui.log.append(end);
      ui.usage.textContent = `${done.inputTokens} in / ${done.outputTokens} out tokens`;
      setState("done");
    } catch (err) {
      const e = el("div", "msg end bad", ctl.signal.aborted ? "stopped" : describe(err));
      e.id = "chat-done";
      ui.log.append(e);
      // The question stays out of the history: it got no answer.
      messages.pop();
      setState("error");
    } finally {
      running = null;
      delete ui.send.dataset.running;
      ui.send.querySelector(".label")!.textContent = "Send";
      for (const box of boxes.values()) {
        const s = box.querySelector(".tool-state.run");
        if (s) {
          s.className = "tool-state badge warn";
          s.textContent = "stopped";
        }
      }
      scroll();
    }
  }

  ui.form.addEventListener("submit", (e) => {
    e.preventDefault();
    void ask();
  });
  ui.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      void ask();
    }
  });
}
