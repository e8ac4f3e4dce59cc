// A file in a `useChat` message, sent by the `ai` package's own chat (tests/system/doors/aisdk/test_aisdk_js.py).
//
// Usage: node files.mjs NODE_MODULES_DIR BASE_URL CHAT_ID PNG_BASE64
// The package's chat (AbstractChat, what useChat wraps) over DefaultChatTransport
// sends `sendMessage({text, files})`: the files as `file` parts, a data URL each,
// as `convertFileListToFileUIParts` makes of a picked file. Then a second
// message names the file the gateway stored by its URL (the file route), each
// request carrying its last message only.
// Prints {messages, status, errors}: the chat's messages as it holds them.
import { load } from "./load.mjs";

const [modules, base, id, png] = process.argv.slice(2);
const ai = await load(modules, "ai");
// The gateway reads the last message only: a chat with files sends only it (useChat
// sends the whole history, every data URL again, by default: docs/doors/aisdk.md "Files").
const transport = new ai.DefaultChatTransport({
  api: `${base}/ai-sdk/chat`,
  prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) => ({
    body: { id, messages: messages.slice(-1), trigger, messageId },
  }),
});

class State {  // a ChatState, as @ai-sdk/react's keeps it, without React
  constructor() { this.status = "ready"; this.error = undefined; this.messages = []; }
  pushMessage(m) { this.messages = [...this.messages, m]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? m : x)); }
  snapshot(thing) { return structuredClone(thing); }
}

const state = new State();
const errors = [];
const chat = new ai.AbstractChat({
  id, transport, state, onError: (e) => errors.push(String(e?.message ?? e)),
});
const picked = {
  type: "file", mediaType: "image/png", filename: "dot.png", url: `data:image/png;base64,${png}`,
};
await chat.sendMessage({ text: "What is in this picture?", files: [picked] });
const first = chat.status;
// The same picture again, by the URL of the file the gateway kept (a relative URL).
const stored = await fetch(`${base}/sessions/${id}/messages`).then((r) => r.json());
const fileId = stored.messages[0].content.find((b) => b.type === "image").file_id;
const served = { type: "file", mediaType: "image/png", url: `/sessions/${id}/files/${fileId}` };
await chat.sendMessage({ text: "And now?", files: [served] });
process.stdout.write(JSON.stringify({ messages: state.messages, first, status: chat.status, errors }));
