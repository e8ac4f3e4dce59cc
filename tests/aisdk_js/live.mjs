// The `ai` package's DefaultChatTransport against a running gateway (tests/system/doors/aisdk/test_aisdk_js.py).
//
// Usage: node live.mjs NODE_MODULES_DIR BASE_URL
// Prints one JSON object: for each case the chunks the transport read (it
// validates each against `uiMessageChunkSchema` itself) and the UIMessage
// `readUIMessageStream` assembled from them, with the errors it reported.
import { assemble, load, recording } from "./load.mjs";

const [modules, base] = process.argv.slice(2);
const ai = await load(modules, "ai");
const transport = new ai.DefaultChatTransport({ api: `${base}/ai-sdk/chat` });

const script = (rounds, more = {}) => JSON.stringify({ script: { rounds, ...more } });
const TEXT = script([[{ thinking: "Greet them." }, { text: "Hello from the gateway." }]]);
const TOOL = script([
  [{ text: "Running it now." }, { tool_use: { name: "sleep", input: { seconds: 0.01 } } }],
  [{ text: "All done." }],
]);
// Slow: a text streamed word by word, a nap of 2 s, then more text.
const SLOW = script([
  [{ text: "One two three four five six." }, { tool_use: { name: "sleep", input: { seconds: 2 } } }],
  [{ text: "Seven eight nine ten." }],
], { delay_ms: 40, chunk_chars: 4 });

class State {  // a ChatState, as @ai-sdk/react's keeps it, without React
  constructor() { this.status = "ready"; this.error = undefined; this.messages = []; }
  pushMessage(m) { this.messages = [...this.messages, m]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? m : x)); }
  snapshot(thing) { return structuredClone(thing); }
}

let n = 0;
const chatId = (name) => `js-${name}-${process.pid}-${Date.now()}-${n++}`;
const user = (text) => ({ id: `u-${n++}`, role: "user", parts: [{ type: "text", text }] });
const send = (id, text, abortSignal) => transport.sendMessages({
  chatId: id, messages: [user(text)], trigger: "submit-message", messageId: undefined, abortSignal,
});

async function read(stream, message) {
  const chunks = [];
  const { message: m, errors } = await assemble(ai, recording(stream, chunks), message);
  return { chunks, message: m, errors };
}

// A response's chunks until `until` says so, then the stream dropped (the turn goes on).
async function readSome(stream, until) {
  const chunks = [];
  const reader = stream.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    chunks.push(value);
    if (until(chunks)) break;
  }
  await reader.cancel();
  return chunks;
}

const out = {};

// 1. A text turn and a tool turn.
out.text = await read(await send(chatId("text"), TEXT));
out.tool = await read(await send(chatId("tool"), TOOL));

// 2. A resume of a turn in flight: the whole message so far, then live, then the end.
{
  const id = chatId("resume");
  const dropped = await readSome(await send(id, SLOW), (c) => c.filter((x) => x.type === "text-delta").length >= 3);
  const stream = await transport.reconnectToStream({ chatId: id });
  out.resume = { dropped, ...(await read(stream)) };
  // 3. Nothing in flight any more: null (204).
  out.none = await transport.reconnectToStream({ chatId: id });
}

// 4. A stop: the response streaming the turn ends with abort, then finish.
{
  const id = chatId("stop");
  const stream = await send(id, SLOW);
  const chunks = [];
  const reading = assemble(ai, recording(stream, chunks));
  while (!chunks.some((c) => c.type === "text-delta")) await new Promise((r) => setTimeout(r, 20));
  // Content-Type even with no body: every POST says it (docs/protocol.md §15).
  const stopped = await fetch(`${base}/ai-sdk/chat/${id}/stop`, {
    method: "POST", headers: { "content-type": "application/json" },
  });
  const { message, errors } = await reading;
  out.stop = { status: stopped.status, body: await stopped.json(), chunks, message, errors };
}

// 5. The package's chat (what useChat wraps): its stop drops the stream (the turn goes
// on), its resumeStream replays the turn's message from the start in place of the
// one it holds (resumeStreamIsReplay): the message whole, each part once.
{
  const state = new State();
  const errors = [];
  const chat = new ai.AbstractChat({
    id: chatId("chat"), transport, state, onError: (e) => errors.push(String(e?.message ?? e)),
  });
  const texts = () => (state.messages.find((m) => m.role === "assistant")?.parts ?? [])
    .filter((p) => p.type === "text");
  const sending = chat.sendMessage({ text: SLOW });
  while (!texts().some((p) => p.text.length > 8)) await new Promise((r) => setTimeout(r, 20));
  await chat.stop();
  await sending;
  const dropped = structuredClone(state.messages);
  await chat.resumeStream();
  out.chat = { dropped, messages: structuredClone(state.messages), status: chat.status, errors };
}

process.stdout.write(JSON.stringify(out));
