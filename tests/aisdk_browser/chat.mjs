// useChat's core in a browser page: the `ai` package's AbstractChat with a minimal
// state (what @ai-sdk/react's useChat wraps), bundled with esbuild and injected
// into the gateway's own page by tests/system/doors/aisdk/test_aisdk_browser.py.
//
// window.aisdkTest drives chats by id; every state write of a chat's messages
// is recorded (the assistant message's parts as they were), so the test can
// check that no part was ever shown twice, not only at the end.
import {
  AbstractChat,
  DefaultChatTransport,
  WebSocketChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";

/** A ChatState as @ai-sdk/react's: immutable arrays, snapshots by structuredClone. */
class RecordingState {
  constructor(messages) {
    this.status = "ready";
    this.error = undefined;
    this.messages = messages;
    this.writes = [];
  }
  record(message) {
    if (message.role === "assistant") this.writes.push(structuredClone(message.parts));
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
    this.record(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [
      ...this.messages.slice(0, index),
      this.snapshot(message),
      ...this.messages.slice(index + 1),
    ];
    this.record(message);
  };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor({ messages = [], ...init }) {
    const state = new RecordingState(messages);
    super({ ...init, state });
    this.recorded = state;
  }
}

function transport(kind, key) {
  if (kind === "ws") {
    // A browser's WebSocket cannot send headers: the key is a query parameter.
    return new WebSocketChatTransport({ url: "/ai-sdk/ws", params: { key } });
  }
  return new DefaultChatTransport({
    api: "/ai-sdk/chat",
    headers: { Authorization: `Bearer ${key}` },
  });
}

const chats = new Map();

function entry(id) {
  const found = chats.get(id);
  if (found === undefined) throw new Error(`no chat ${id}`);
  return found;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

window.aisdkTest = {
  /** A chat on one transport; `restore`: the messages this tab saved before a reload. */
  open(id, kind, key, restore = false) {
    const saved = restore ? sessionStorage.getItem(`chat:${id}`) : null;
    const finishes = [];
    const errors = [];
    const carrier = transport(kind, key);
    const chat = new Chat({
      id,
      messages: saved ? JSON.parse(saved) : [],
      transport: carrier,
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      onFinish: ({ message, isAbort, isDisconnect, isError, finishReason }) =>
        finishes.push({ messageId: message.id, isAbort, isDisconnect, isError, finishReason }),
      onError: (error) => errors.push(String(error)),
    });
    chats.set(id, { chat, carrier, finishes, errors, sent: null });
    return true;
  },

  /** sendMessage, not awaited (`sent` holds its promise). */
  send(id, text) {
    const found = entry(id);
    found.sent = found.chat.sendMessage({ text }).then(
      () => "resolved",
      (error) => `rejected: ${error}`,
    );
  },

  async sent(id) {
    return await entry(id).sent;
  },

  resume(id) {
    const found = entry(id);
    found.sent = found.chat.resumeStream().then(
      () => "resolved",
      (error) => `rejected: ${error}`,
    );
  },

  approve(id, approvalId, approved) {
    entry(id).chat.addToolApprovalResponse({ id: approvalId, approved });
  },

  /** useChat's stop(): the request dropped (over the WebSocket: an `abort` frame). */
  async stop(id) {
    await entry(id).chat.stop();
  },

  /** The WebSocket closed under the chat (as a network would): its requests fail. */
  drop(id) {
    entry(id).carrier.close();
  },

  /** What the app persists before the tab goes away. */
  save(id) {
    sessionStorage.setItem(`chat:${id}`, JSON.stringify(entry(id).chat.messages));
  },

  /** Until `finished` responses have finished and the chat is idle. */
  async settled(id, finished, timeoutMs = 15000) {
    const { chat, finishes } = entry(id);
    const deadline = Date.now() + timeoutMs;
    while (finishes.length < finished || chat.status === "submitted" || chat.status === "streaming") {
      if (Date.now() > deadline) {
        throw new Error(`not settled: ${finishes.length} finished, status ${chat.status}`);
      }
      await sleep(20);
    }
    return this.view(id);
  },

  /** Until the last assistant message's text parts hold at least `chars` characters. */
  async streamed(id, chars, timeoutMs = 15000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const last = entry(id).chat.lastMessage;
      const text = last?.role === "assistant" ? textOf(last) : "";
      if (text.length >= chars) return text;
      if (Date.now() > deadline) throw new Error(`only ${text.length} characters streamed`);
      await sleep(10);
    }
  },

  view(id) {
    const { chat, finishes, errors } = entry(id);
    return {
      status: chat.status,
      error: chat.error ? String(chat.error) : null,
      messages: chat.messages,
      finishes,
      errors,
      writes: chat.recorded.writes,
    };
  },
};

function textOf(message) {
  return message.parts
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");
}
