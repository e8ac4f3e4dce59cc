// A tool approval round with the `ai` package's own chat (tests/system/doors/aisdk/test_aisdk_js.py).
//
// Usage: node approval.mjs NODE_MODULES_DIR BASE_URL
// An AbstractChat (what useChat wraps) with DefaultChatTransport and
// `sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses`:
// the first answer ends with the tool part approval-requested;
// `addToolApprovalResponse` sends the message back and the turn continues.
// Prints, for a chat allowing, one denying and one allowing a worker's request,
// its messages after each step.
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

const TOOL = JSON.stringify({ script: { rounds: [
  [{ text: "Running it now." }, { tool_use: { name: "sleep", input: { seconds: 0.01 } } }],
  [{ text: "All done." }],
] } });

// A worker asks: the approval is on the parent's delegate call (docs/protocol.md §5).
const TASK = JSON.stringify({ script: { rounds: [
  [{ text: "Napping." }, { tool_use: { name: "sleep", input: { seconds: 0.01 } } }],
  [{ text: "Worker awake." }],
] } });
const DELEGATE = JSON.stringify({ script: { rounds: [
  [{ text: "Asking a worker." }, { tool_use: { name: "delegate", input: { task: TASK } } }],
  [{ text: "All done." }],
] } });

// One chat through one approval, answered `approved`.
async function round(name, approved, script = TOOL) {
  const state = new State();
  const errors = [];
  const chat = new ai.AbstractChat({
    id: `js-${name}-${process.pid}-${Date.now()}`,
    transport: new ai.DefaultChatTransport({ api: `${base}/ai-sdk/chat` }),
    state,
    sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (e) => errors.push(String(e?.message ?? e)),
  });
  const settled = async (what) => {
    for (let i = 0; i < 400; i++) {
      if (what()) return;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`timed out: status ${chat.status}, ${JSON.stringify(state.messages)}`);
  };
  const out = {};
  await chat.sendMessage({ text: script });
  await settled(() => chat.status === "ready");
  out.asked = structuredClone(state.messages);
  const part = state.messages.at(-1).parts.find((p) => p.state === "approval-requested");
  if (part === undefined) throw new Error(`no approval asked: ${JSON.stringify(state.messages)}`);
  await chat.addToolApprovalResponse({ id: part.approval.id, approved });
  const ended = approved ? "output-available" : "output-denied";
  await settled(() => chat.status === "ready" && state.messages.at(-1).parts.some(
    (p) => p.toolCallId === part.toolCallId && p.state === ended));
  out.done = structuredClone(state.messages);
  out.errors = errors;
  out.status = chat.status;
  return out;
}

const out = {
  allowed: await round("allow", true),
  denied: await round("deny", false),
  worker: await round("worker", true, DELEGATE),
};
process.stdout.write(JSON.stringify(out));
