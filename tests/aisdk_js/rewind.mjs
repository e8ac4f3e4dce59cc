// useChat's regenerate() and an edited message with the `ai` package's own chat
// (tests/system/doors/aisdk/test_aisdk_js.py; docs/doors/aisdk.md).
//
// Usage: node rewind.mjs NODE_MODULES_DIR BASE_URL
// An AbstractChat (what useChat wraps) with DefaultChatTransport: two questions,
// regenerate() the last answer, edit the first question (sendMessage with its
// messageId), then regenerate() again. Prints the chat's messages after each step,
// its errors and the chat's id (the gateway's session).
import { load } from "./load.mjs";

const [modules, base] = process.argv.slice(2);
const ai = await load(modules, "ai");

class State {  // a ChatState, as @ai-sdk/react's keeps it, without React
  constructor() { this.status = "ready"; this.error = undefined; this.messages = []; }
  pushMessage(m) { this.messages = [...this.messages, m]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? m : x)); }
  snapshot(thing) { return structuredClone(thing); }
}

const state = new State();
const errors = [];
const id = `js-rewind-${process.pid}-${Date.now()}`;
const chat = new ai.AbstractChat({
  id,
  transport: new ai.DefaultChatTransport({ api: `${base}/ai-sdk/chat` }),
  state,
  onError: (e) => errors.push(String(e?.message ?? e)),
});
const settled = async () => {
  for (let i = 0; i < 400; i++) {
    if (chat.status === "ready" || chat.status === "error") return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out: status ${chat.status}, ${JSON.stringify(state.messages)}`);
};
const out = { id };
await chat.sendMessage({ text: "The first question" });
await settled();
await chat.sendMessage({ text: "The second question" });
await settled();
out.asked = structuredClone(state.messages);
await chat.regenerate();
await settled();
out.regenerated = structuredClone(state.messages);
await chat.sendMessage({ text: "The first question, edited", messageId: state.messages[0].id });
await settled();
out.edited = structuredClone(state.messages);
await chat.regenerate();
await settled();
out.again = structuredClone(state.messages);
out.errors = errors;
out.status = chat.status;
process.stdout.write(JSON.stringify(out));
