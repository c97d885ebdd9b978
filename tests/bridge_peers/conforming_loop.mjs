// A tiny agent loop in plain Node.js (no npm packages) that speaks the bridge
// protocol, version 1. The test suite drives it through statemachine.testing.bridge
// to show that the kit judges a loop in another language. Tool calls run one after
// another and every line is read in order, so an abort is seen at the same point of
// every run. broken_loop.mjs reuses it with one defect.
import { createInterface } from "node:readline";

const PROTOCOL = 1;

export function send(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

// Lines from the kit, handed out one at a time to whoever awaits the next.
class Inbox {
  constructor() {
    this.lines = [];
    this.waiters = [];
    this.closed = false;
    const rl = createInterface({ input: process.stdin });
    rl.on("line", (line) => {
      const waiter = this.waiters.shift();
      if (waiter) waiter(line);
      else this.lines.push(line);
    });
    rl.on("close", () => {
      this.closed = true;
      for (const waiter of this.waiters.splice(0)) waiter(null);
    });
  }
  next() {
    if (this.lines.length) return Promise.resolve(this.lines.shift());
    if (this.closed) return Promise.resolve(null);
    return new Promise((resolve) => this.waiters.push(resolve));
  }
}

export class Peer {
  constructor() {
    this.inbox = new Inbox();
    this.aborted = false;
    this.nextId = 0;
  }
  async read() {
    const line = await this.inbox.next();
    if (line === null) process.exit(0); // the kit has gone: nothing left to do
    const message = JSON.parse(line);
    if (message.type === "abort") this.aborted = true;
    return message;
  }
  // Send a request and wait for its answer; forward an abort that arrives meanwhile.
  async request(message) {
    const id = `op${++this.nextId}`;
    send({ ...message, id });
    let cancelled = this.aborted;
    for (;;) {
      const reply = await this.read();
      if (reply.type === "abort" && !cancelled) {
        send({ type: "cancel", id });
        cancelled = true;
      } else if (reply.id === id) {
        return reply;
      }
    }
  }
}

// The subset of JSON Schema the kit's tools use: property types, required, extras.
export function invalid(schema, args) {
  const kinds = {
    string: (v) => typeof v === "string",
    integer: (v) => Number.isInteger(v),
    number: (v) => typeof v === "number",
    boolean: (v) => typeof v === "boolean",
  };
  const properties = schema.properties ?? {};
  for (const name of schema.required ?? []) {
    if (!(name in args)) return `missing required argument '${name}'`;
  }
  for (const [name, value] of Object.entries(args)) {
    const spec = properties[name];
    if (!spec) {
      if (schema.additionalProperties === false) return `unexpected argument '${name}'`;
      continue;
    }
    const ok = kinds[spec.type];
    if (ok && !ok(value)) return `argument '${name}' must be a ${spec.type}`;
  }
  return null;
}

function errorResult(call, text) {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [{ type: "text", text }],
    isError: true,
  };
}

export const hooks = {
  // Whether to validate a call's arguments before running it.
  validate: true,
};

export async function run(peer, start) {
  const history = [...start.messages];
  const tools = new Map(start.tools.map((t) => [t.name, t]));
  const seen = new Set();
  for (const m of history) {
    if (m.role === "assistant") for (const b of m.content) if (b.type === "toolCall") seen.add(b.id);
  }
  let turns = 0;
  for (;;) {
    if (peer.aborted) return history;
    turns += 1;
    const reply = await peer.request({ type: "modelRequest", messages: history });
    if (reply.type === "modelError") {
      history.push({ role: "assistant", content: [], stopReason: "error", errorMessage: reply.error });
      return history;
    }
    const message = reply.message;
    const calls = message.content.filter((b) => b.type === "toolCall");
    for (const call of calls) {
      // Empty or repeated ids would break pairing by id.
      if (!call.id || seen.has(call.id)) {
        let n = seen.size;
        while (seen.has(`call_r${n}`)) n += 1;
        call.id = `call_r${n}`;
      }
      seen.add(call.id);
    }
    history.push(message);
    if (message.stopReason === "error" || message.stopReason === "aborted" || peer.aborted) {
      // A response that arrived after the abort is kept as it is, but not acted on.
      const why = peer.aborted ? "the run was aborted" : `the response ended with ${message.stopReason}`;
      for (const call of calls) history.push(errorResult(call, `Not run: ${why}`));
      return history;
    }
    if (calls.length === 0) return history;
    for (const call of calls) {
      const tool = tools.get(call.name);
      const problem = tool && hooks.validate ? invalid(tool.parameters, call.arguments) : null;
      if (peer.aborted) history.push(errorResult(call, "Not run: the run was aborted"));
      else if (!tool) history.push(errorResult(call, `Tool ${call.name} not found`));
      else if (problem) history.push(errorResult(call, `Invalid arguments for ${call.name}: ${problem}`));
      else {
        const answer = await peer.request({ type: "toolExecute", name: call.name, arguments: call.arguments });
        history.push({
          role: "toolResult",
          toolCallId: call.id,
          toolName: call.name,
          content: answer.content,
          isError: answer.isError,
        });
      }
    }
    if (turns >= start.maxTurns) return history;
  }
}

export async function main(name) {
  send({ type: "hello", protocol: PROTOCOL, peer: name });
  const peer = new Peer();
  const start = await peer.read();
  peer.aborted = Boolean(start.aborted);
  send({ type: "result", messages: await run(peer, start) });
  process.exit(0);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  await main("tests/bridge_peers/conforming_loop.mjs");
}
