// The `ai` package's WebSocketChatTransport, over the `ws` package, against a running
// gateway (tests/system/doors/aisdk/test_aisdk_js.py).
//
// Usage: node socket.mjs NODE_MODULES_DIR BASE_URL
// Prints one JSON object: a text turn, a resume of a turn in flight (the whole
// message, then live), no resume with nothing in flight (null), and an abort of
// a send that cancels its turn; each with the chunks the transport read (it
// validates each against `uiMessageChunkSchema`) and the UIMessage assembled.
import { assemble, load, recording } from "./load.mjs";

const [modules, base] = process.argv.slice(2);
const ai = await load(modules, "ai");
const ws = await load(modules, "ws");
const WebSocket = ws.WebSocket ?? ws.default;
const url = `${base.replace(/^http/, "ws")}/ai-sdk/ws`;
const transport = new ai.WebSocketChatTransport({ url, webSocket: WebSocket });

const script = (rounds, more = {}) => JSON.stringify({ script: { rounds, ...more } });
const TEXT = script([[{ thinking: "Greet them." }, { text: "Hello over the socket." }]]);
const SLOW = script([
  [{ text: "One two three." }, { tool_use: { name: "sleep", input: { seconds: 1.5 } } }],
  [{ text: "Four five six." }],
], { delay_ms: 30, chunk_chars: 4 });
const LONG = script([
  [{ text: "Napping." }, { tool_use: { name: "sleep", input: { seconds: 60 } } }],
  [{ text: "Awake." }],
]);

let n = 0;
const chatId = (name) => `ws-${name}-${process.pid}-${Date.now()}-${n++}`;
const user = (text) => ({ id: `u-${n++}`, role: "user", parts: [{ type: "text", text }] });
const send = (id, text, abortSignal) => transport.sendMessages({
  chatId: id, messages: [user(text)], trigger: "submit-message", messageId: undefined, abortSignal,
});

async function read(stream) {
  const chunks = [];
  const { message, errors } = await assemble(ai, recording(stream, chunks), undefined);
  return { chunks, message, errors };
}

async function until(stream, done) {  // read until done(chunks), then let the stream go
  const chunks = [];
  const reader = stream.getReader();
  for (;;) {
    const { value, done: over } = await reader.read();
    if (over) break;
    chunks.push(value);
    if (done(chunks)) break;
  }
  reader.releaseLock();
  return chunks;
}

const out = {};
const said = chatId("text");
out.text = await read(await send(said, TEXT));

// A turn in flight, resumed on the same socket: the whole message, then live.
const slow = chatId("resume");
const first = await send(slow, SLOW);
await until(first, (c) => c.some((x) => x.type === "tool-input-available"));
out.resume = await read(await transport.reconnectToStream({ chatId: slow }));
out.none = await transport.reconnectToStream({ chatId: said });  // its turn is over

// An abort of a send: its turn is cancelled (the test asks the gateway).
const long = chatId("abort");
const controller = new AbortController();
const aborted = await send(long, LONG, controller.signal);
await until(aborted, (c) => c.some((x) => x.type === "tool-input-available"));
controller.abort();
out.abort = { chat: long };
await new Promise((resolve) => setTimeout(resolve, 500));  // the abort frame on its way
transport.close();
console.log(JSON.stringify(out));
process.exit(0);
