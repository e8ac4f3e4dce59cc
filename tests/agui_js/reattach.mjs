// The official AG-UI JS client reads re-attached runs (tests/system/doors/agui/test_agui_js.py).
//
// Usage: node reattach.mjs NODE_MODULES_DIR BASE_URL
// Streams one run with fetch (text, reasoning, a tool call and its result),
// keeping each SSE event's id; then, for every k, re-attaches with the id of
// event k as Last-Event-ID (GET /agui/{threadId}/runs/{runId}/stream) through
// an HttpAgent, whose verifyEvents checks each resumed stream on its own: a
// violation rejects runAgent, and this script exits 1. Prints one JSON object.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, base] = process.argv.slice(2);
const require = createRequire(path.join(modules, "package.json"));
const { HttpAgent } = require("@ag-ui/client");

const content = JSON.stringify({ script: { rounds: [
  [{ thinking: "Let me check." }, { text: "Running it now." },
   { tool_use: { name: "sleep", input: { seconds: 0.01 } } }],
  [{ text: "All done." }],
] } });
const threadId = `js-reattach-${Date.now()}`;
const runId = `run-${Math.random().toString(16).slice(2)}`;

// The uninterrupted run, read as plain SSE: each event with its id.
const answer = await fetch(`${base}/agui`, {
  method: "POST",
  headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
  body: JSON.stringify({
    threadId, runId, tools: [], context: [], state: {}, forwardedProps: {},
    messages: [{ id: "u1", role: "user", content }],
  }),
});
const full = [];
for (const block of (await answer.text()).split("\n\n")) {
  let id = null;
  let data = null;
  for (const line of block.split("\n")) {
    if (line.startsWith("id: ")) id = line.slice(4);
    if (line.startsWith("data: ")) data = JSON.parse(line.slice(6));
  }
  if (data) full.push({ id, event: data });
}

// An HttpAgent that re-attaches: a GET of the run's stream, with Last-Event-ID.
class Reattach extends HttpAgent {
  constructor(lastEventId) {
    super({ url: `${base}/agui/${threadId}/runs/${runId}/stream`, threadId });
    this.lastEventId = lastEventId;
  }

  requestInit() {
    const headers = { ...this.headers, Accept: "text/event-stream" };
    if (this.lastEventId) headers["Last-Event-ID"] = this.lastEventId;
    return { method: "GET", headers, signal: this.abortController.signal };
  }
}

const resumed = [];
for (let k = 0; k <= full.length; k++) {
  const agent = new Reattach(k === 0 ? null : full[k - 1].id);
  const events = [];
  await agent.runAgent({ runId }, { onEvent: ({ event }) => { events.push(event); } });
  resumed.push({ k, types: events.map((e) => e.type) });
}
console.log(JSON.stringify({
  ids: full.map((e) => e.id),
  types: full.map((e) => e.event.type),
  resumed,
}));
