// A picture in an AG-UI user message, sent by the official JS client (tests/system/doors/agui/test_agui_js.py).
//
// Usage: node files.mjs NODE_MODULES_DIR BASE_URL THREAD_ID PNG_BASE64
// HttpAgent runs a message whose content is parts: text and an AG-UI 1.0 image
// part (a `data` source), then the legacy `binary` part (the client upgrades it
// itself), then a text message: that run's MESSAGES_SNAPSHOT shows the pictures
// as image parts whose source is the gateway's file URL. HttpAgent verifies every
// event itself: a violation rejects runAgent, and this script exits 1.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, base, threadId, png] = process.argv.slice(2);
const require = createRequire(path.join(modules, "package.json"));
const { HttpAgent } = require("@ag-ui/client");

const agent = new HttpAgent({ url: `${base}/agui`, threadId });
let n = 0;
async function run(content) {
  agent.addMessage({ id: `user-${n++}`, role: "user", content });
  const events = [];
  await agent.runAgent({}, { onEvent: ({ event }) => { events.push(event); } });
  return events;
}
const said = (events) => events.filter((e) => e.type === "TEXT_MESSAGE_CONTENT").map((e) => e.delta).join("");

const out = {};
out.modern = said(await run([
  { type: "text", text: "What is this?" },
  { type: "image", source: { type: "data", value: png, mimeType: "image/png" } },
]));
out.legacy = said(await run([
  { type: "binary", mimeType: "image/png", data: png, filename: "dot.png" },
  { type: "text", text: "And this?" },
]));
const last = await run("Thanks.");
out.snapshot = last.find((e) => e.type === "MESSAGES_SNAPSHOT").messages;
out.messages = agent.messages;
console.log(JSON.stringify(out));
