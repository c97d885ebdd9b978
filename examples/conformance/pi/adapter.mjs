// pi-agent-core (@mariozechner/pi-agent-core 0.73.1) as a peer of the bridge protocol,
// version 1 (specs/bridge-protocol.md): pi's own low-level loop, `agentLoop`, runs
// with its documented defaults; this file only supplies
//   - a stream function (pi's documented `streamFn` hook) that asks the kit for each
//     model response, and behaves like pi-ai's providers around an abort: a request
//     made with an already aborted signal ends at once with stopReason "aborted"
//     without reaching the model (a provider's fetch rejects), and a request in flight
//     forwards the abort as `cancel` and delivers whatever the model answers;
//   - one AgentTool per kit tool, with the kit's JSON Schema (pi validates it), whose
//     execute sends `toolExecute`, forwards its signal as `cancel`, and throws on an
//     error result (pi's contract: "Throw on failure instead of encoding errors");
//   - the turn limit through pi's `shouldStopAfterTurn` hook (pi has no turn limit
//     of its own): stop once maxTurns responses have been handled;
//   - the kit's abort as `AbortController.abort()` on the signal given to agentLoop;
//   - the input history in pi's message types, and pi's context back in ours.
// The tool execution mode is pi Agent's default, "parallel".
import { createInterface } from "node:readline";
import { agentLoop } from "@mariozechner/pi-agent-core";
import { createAssistantMessageEventStream } from "@mariozechner/pi-ai";

const PROTOCOL = 1;

function send(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

const MODEL = {
  id: "scripted",
  name: "statemachine conformance kit",
  api: "conformance",
  provider: "conformance",
  baseUrl: "",
  reasoning: false,
  input: ["text"],
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
  contextWindow: 1_000_000,
  maxTokens: 100_000,
};

const USAGE = {
  input: 0,
  output: 0,
  cacheRead: 0,
  cacheWrite: 0,
  totalTokens: 0,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
};

// -- wire format <-> pi messages ----------------------------------------------------------

function toPi(m) {
  const timestamp = Date.now();
  if (m.role === "user") return { role: "user", content: m.content, timestamp };
  if (m.role === "assistant") {
    const out = {
      role: "assistant",
      content: m.content,
      api: MODEL.api,
      provider: MODEL.provider,
      model: MODEL.id,
      usage: USAGE,
      stopReason: m.stopReason,
      timestamp,
    };
    if (m.errorMessage !== undefined) out.errorMessage = m.errorMessage;
    return out;
  }
  return { ...m, timestamp };
}

function blockToWire(b) {
  if (b.type === "text") return { type: "text", text: b.text };
  if (b.type === "toolCall") return { type: "toolCall", id: b.id, name: b.name, arguments: b.arguments };
  if (b.type === "thinking") return { type: "thinking", thinking: b.thinking };
  if (b.type === "image") return { type: "image", data: b.data, mimeType: b.mimeType };
  return { type: "text", text: JSON.stringify(b) };
}

function toWire(m) {
  if (m.role === "user") {
    const content = typeof m.content === "string" ? [{ type: "text", text: m.content }] : m.content.map(blockToWire);
    return { role: "user", content };
  }
  if (m.role === "assistant") {
    const out = { role: "assistant", content: m.content.map(blockToWire), stopReason: m.stopReason };
    if (m.errorMessage !== undefined) out.errorMessage = m.errorMessage;
    return out;
  }
  return {
    role: "toolResult",
    toolCallId: m.toolCallId,
    toolName: m.toolName,
    content: m.content.map(blockToWire),
    isError: Boolean(m.isError),
  };
}

// -- the conversation with the kit ---------------------------------------------------------

const pending = new Map(); // request id -> resolve
let nextId = 0;
let onStart = null;
const run = new AbortController();

createInterface({ input: process.stdin }).on("line", (line) => {
  const message = JSON.parse(line);
  if (message.type === "start") onStart(message);
  else if (message.type === "abort") run.abort(new Error(message.reason));
  else if (pending.has(message.id)) {
    const resolve = pending.get(message.id);
    pending.delete(message.id);
    resolve(message);
  }
});

// Send a request; forward an abort of `signal` as `cancel`; resolve with the kit's answer.
function request(message, signal) {
  const id = `op${++nextId}`;
  return new Promise((resolve) => {
    const cancel = () => send({ type: "cancel", id });
    signal?.addEventListener("abort", cancel, { once: true });
    pending.set(id, (reply) => {
      signal?.removeEventListener("abort", cancel);
      resolve(reply);
    });
    send({ ...message, id });
  });
}

function streamFn(model, context, options) {
  const stream = createAssistantMessageEventStream();
  const signal = options?.signal;
  (async () => {
    let message;
    if (signal?.aborted) {
      message = { ...toPi({ role: "assistant", content: [], stopReason: "aborted" }), errorMessage: "Request was aborted" };
    } else {
      const reply = await request({ type: "modelRequest", messages: context.messages.map(toWire) }, signal);
      message =
        reply.type === "modelError"
          ? toPi({ role: "assistant", content: [], stopReason: "error", errorMessage: reply.error })
          : toPi(reply.message);
    }
    stream.push({ type: "start", partial: message });
    if (message.stopReason === "error" || message.stopReason === "aborted") {
      stream.push({ type: "error", reason: message.stopReason, error: message });
    } else {
      stream.push({ type: "done", reason: message.stopReason, message });
    }
  })();
  return stream;
}

function agentTool(spec) {
  return {
    name: spec.name,
    label: spec.name,
    description: spec.description,
    parameters: spec.parameters,
    async execute(toolCallId, params, signal) {
      const reply = await request({ type: "toolExecute", name: spec.name, arguments: params }, signal);
      if (reply.isError) throw new Error(reply.content.map((b) => b.text ?? "").join("\n"));
      return { content: reply.content, details: {} };
    },
  };
}

send({ type: "hello", protocol: PROTOCOL, peer: "pi-agent-core 0.73.1 agentLoop" });
const start = await new Promise((resolve) => {
  onStart = resolve;
});
if (start.aborted) run.abort(new Error("aborted before the start"));
const input = start.messages.map(toPi);
const prompts = [input.pop()];
const context = { systemPrompt: "", messages: input, tools: start.tools.map(agentTool) };
let responses = 0;
const config = {
  model: MODEL,
  convertToLlm: (messages) => messages.filter((m) => ["user", "assistant", "toolResult"].includes(m.role)),
  shouldStopAfterTurn: () => ++responses >= start.maxTurns,
  toolExecution: "parallel",
};
const stream = agentLoop(prompts, context, config, run.signal, streamFn);
for await (const _event of stream) {
  // The events drive a UI; the result is read once the loop ends.
}
const added = await stream.result();
// agentLoop returns the messages it added, the prompt first.
send({ type: "result", messages: [...start.messages.slice(0, -1), ...added.map(toWire)] });
process.exit(0);
