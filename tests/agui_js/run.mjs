// The official AG-UI JS client against a running gateway (issue 14; tests/system/doors/agui/test_agui_js.py).
//
// Usage: node run.mjs NODE_MODULES_DIR BASE_URL
// Prints one JSON object: what each run saw. HttpAgent verifies every event
// itself (verifyEvents): a violation rejects runAgent, and this script exits 1.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, base] = process.argv.slice(2);
const require = createRequire(path.join(modules, "package.json"));
const { HttpAgent } = require("@ag-ui/client");

const script = (rounds) => JSON.stringify({ script: { rounds } });
const TEXT = script([[{ thinking: "Greet them." }, { text: "Hello from the gateway." }]]);
const TOOL = script([
  [{ text: "Running it now." }, { tool_use: { name: "sleep", input: { seconds: 0.01 } } }],
  [{ text: "All done." }],
]);

async function run(agent, options = {}) {
  const events = [];
  await agent.runAgent(options, { onEvent: ({ event }) => { events.push(event); } });
  return events;
}

function say(agent, content) {
  agent.addMessage({ id: `user-${Math.random().toString(16).slice(2)}`, role: "user", content });
}

const textOf = (events, id) =>
  events.filter((e) => e.type === "TEXT_MESSAGE_CONTENT" && e.messageId === id)
    .map((e) => e.delta).join("");

const out = {};
const agent = new HttpAgent({ url: `${base}/agui`, threadId: `js-${Date.now()}` });

// 1. Text (with reasoning): the deltas concatenate to the final message.
say(agent, TEXT);
let events = await run(agent);
let last = agent.messages.filter((m) => m.role === "assistant").at(-1);
out.text = {
  types: events.map((e) => e.type),
  deltas: textOf(events, last.id),
  final: last.content,
};

// 2. A tool that needs approval: the run ends with an interrupt ...
say(agent, TOOL);
events = await run(agent);
const finished = events.at(-1);
out.interrupt = { types: events.map((e) => e.type), outcome: finished.outcome,
                  pending: agent.pendingInterrupts.map((i) => i.id) };

// ... and the next run resumes it: the tool's args and result, then the reply.
const resume = agent.pendingInterrupts.map((i) => ({
  interruptId: i.id, status: "resolved", payload: { decision: "allow" },
}));
const resumed = await run(agent, { resume });
events = events.concat(resumed);
const call = agent.messages.flatMap((m) => m.toolCalls ?? []).at(-1);
const result = agent.messages.find((m) => m.role === "tool" && m.toolCallId === call.id);
last = agent.messages.filter((m) => m.role === "assistant").at(-1);
out.tool = {
  types: resumed.map((e) => e.type),
  name: call.function.name,
  args: JSON.parse(call.function.arguments),
  streamedArgs: events.filter((e) => e.type === "TOOL_CALL_ARGS" && e.toolCallId === call.id)
    .map((e) => e.delta).join(""),
  result: result?.content ?? null,
  deltas: textOf(resumed, last.id),
  final: last.content,
  pendingAfter: agent.pendingInterrupts.length,
};
console.log(JSON.stringify(out));
