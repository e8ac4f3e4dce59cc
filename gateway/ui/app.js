// The gateway's web page (docs/clients.md): the HTTP API and one session stream.
//
// Everything the page knows comes from the gateway: the HTTP API of PROTOCOL
// section 2 (with `Authorization: Bearer` once the user typed a key), and the
// session's WebSocket (sections 3 to 8). The state is reduced by ./reducer.js
// (the JS twin of gateway/client/reducer.py) and drawn from one of its two views
// (section 10): `full` or `simple` (replace-then-append). This file owns no
// protocol rule of its own beyond a client's duties:
//
// - attach: `GET /sessions/{id}` for a fresh single-use attach token every
//   time, then `subscribe`: a snapshot the first time, `since` = the last event
//   id after that (a reconnect), a snapshot again on `cursor_expired` or
//   `replay_too_large` (on the same connection);
// - stay attached: answer the server's `ping` with `pong`; send its own `ping`
//   after KEEPALIVE_MS of silence and drop a connection that stays silent as
//   long again; after any drop, reconnect with capped exponential backoff with
//   jitter (the `status` element says "reconnecting" meanwhile);
// - no WebSocket (docs/doors/sse.md): a WebSocket that closes before it
//   ever opened, though the HTTP API answered (a proxy that refuses the
//   upgrade), makes this stream read the same frames from an EventSource on
//   `GET /sessions/{id}/events` from then on: the subscribe is the query (no
//   keepalive of its own: the browser reports the drop), a last `{"type": "close"}` frame
//   is the WebSocket's close; the EventSource's own reconnection (its used
//   token is refused) is replaced by this page's, with a fresh token;
// - the API key: asked for when the gateway answers 401 (or 403 to a key it
//   no longer takes), kept in sessionStorage (this tab only), never in a URL.
//
// - agents (docs/protocol.md §11): a picker filled from `GET /agents` names the
//   agent of a new session (`POST /sessions {"agent"}`); a gateway without that
//   route (404) hides it, and sessions get the default agent.
// - compactions (section 12): one quiet line where the context message stands
//   (`compaction`), the replaced messages kept; "Compacting the context…" as the
//   simple view's status line while one runs.
// - a busy session (section 2, "A busy session"): while a turn runs (or turns wait) the
//   composer's Send becomes Queue (`if_busy: "queue"`, Enter) and Steer appears beside it
//   (`if_busy: "steer"`, Ctrl+Enter): the message for the running turn to take before its
//   next step. The views' `queued` turns are drawn after the conversation (`queued`, dashed,
//   each with a Cancel that calls the cancel route); a steer the turn took stands in it,
//   marked (`data-steered`).
// - elicitations (section 11): a small form built from `requested_schema`
//   (string: text, number/integer: number, boolean: checkbox, enum: select),
//   Submit answers `allow` with `content`, Decline `deny`. A worker's request
//   (its `session_id`) is answered with its own session id.
//
// - edit and regenerate (docs/protocol.md §2 "Edit and regenerate"): each user message
//   of the thread has Edit (its text goes back into the composer, which says so; Send
//   then posts the turn with `rewind_to` that message) and Retry (the turn posted at
//   once with its own text and `rewind_to` it: a new answer in place of the old). The
//   reducer drops the rewound messages on `history.rewound`.
//
// - files (docs/protocol.md §2 "Files"): Attach (a file input taking the 8 media types)
//   uploads each chosen file with `POST /sessions/{id}/files` and lists it above the
//   composer (`attachments`, each `attachment` removable); Send puts them first in the
//   turn's content as image or document blocks by file_id. A message's files (and a
//   tool's) are fetched from `GET /sessions/{id}/files/{file_id}` with the key and shown
//   as an <img> on a blob URL, sized by CSS (`image`), or a label with Download (`file`):
//   never their bytes as HTML.
//
// Elements that tests and automation drive carry data-testid (docs/clients.md): prompt,
// send, cancel, new-session, view-toggle, status, and each message `message`
// with data-role and data-status; agent-picker, compaction, elicitation; steer, queued (with
// data-turn-id and data-position) and its cancel-queued; attach, attach-input, attachments,
// attachment, file (data-file-type) and image (data-file-id). `window.gateway` is a small handle for
// automation (the stream, its state, and `options`, which an init script may
// set before the page loads: {backoffBaseMs, backoffCapMs, keepaliveMs}).

import { Reducer, fileLine, fullView, humanSize, simpleView } from "./reducer.js";

const options = Object.assign(
  { backoffBaseMs: 500, backoffCapMs: 30000, keepaliveMs: 45000 },
  globalThis.gatewayOptions || {},
);
const KEY_STORE = "gateway.apiKey"; // sessionStorage: this tab only
const VIEW_STORE = "gateway.view"; // localStorage: a preference, no secret
const WORKERS_STORE = "gateway.workers";
// Close reasons whose `code` says not to come back (gateway/protocol/closes.py).
const FINAL_CLOSES = new Set(["normal", "session_deleted", "frame_too_large"]);
const SNAPSHOT_INSTEAD = new Set(["cursor_expired", "replay_too_large"]);
const STABLE_MS = 10000;

const $ = (id) => document.querySelector(`[data-testid="${id}"]`);
const ui = {
  status: $("status"),
  title: $("session-title"),
  sessions: $("sessions"),
  newSession: $("new-session"),
  agentPicker: $("agent-picker"),
  refresh: $("refresh-sessions"),
  thread: $("thread"),
  empty: $("empty"),
  activity: $("activity"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  steer: $("steer"),
  cancel: $("cancel"),
  attach: $("attach"),
  attachInput: $("attach-input"),
  attachments: $("attachments"),
  viewToggle: $("view-toggle"),
  workers: $("workers-toggle"),
  error: $("error"),
  keyDialog: $("key-dialog"),
  keyForm: $("key-form"),
  keyInput: $("api-key"),
  keyError: $("key-error"),
};

// --- small helpers -------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

let errorTimer = 0;
function showError(message, kind = "error") {
  ui.error.textContent = message;
  ui.error.classList.toggle("info", kind === "info");
  ui.error.hidden = false;
  clearTimeout(errorTimer);
  errorTimer = setTimeout(() => {
    ui.error.hidden = true;
  }, 8000);
}

function shortId(id) {
  return id.length > 14 ? `${id.slice(0, 9)}…${id.slice(-4)}` : id;
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ms).toLocaleDateString();
}

// Unicode's bidirectional controls, shown as escapes where a tool's input or result is
// shown: they could make it display in an order other than its own ("Trojan Source").
const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function visible(text) {
  return text.replace(BIDI, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

function pretty(value) {
  if (typeof value === "string") return visible(value);
  try {
    return visible(JSON.stringify(value, null, 2));
  } catch {
    return visible(String(value));
  }
}

/** Equal jitter: uniform in the upper half of min(cap, base * 2^(attempt-1)). */
function backoffDelay(attempt, rand, baseMs = options.backoffBaseMs, capMs = options.backoffCapMs) {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt - 1, 30));
  return ceiling * (0.5 + 0.5 * rand);
}

// --- the HTTP API, with the key ------------------------------------------------------

class HttpError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let keyPrompt = null; // one dialog at a time, however many requests wait on it

function askForKey(reason) {
  if (!keyPrompt) {
    keyPrompt = new Promise((resolve) => {
      ui.keyError.textContent = reason || "";
      ui.keyError.hidden = !reason;
      ui.keyInput.value = "";
      const done = (event) => {
        event.preventDefault();
        const key = ui.keyInput.value.trim();
        if (!key) return;
        ui.keyForm.removeEventListener("submit", done);
        ui.keyDialog.close();
        sessionStorage.setItem(KEY_STORE, key);
        keyPrompt = null;
        resolve(key);
      };
      ui.keyForm.addEventListener("submit", done);
      ui.keyDialog.addEventListener("cancel", (event) => event.preventDefault()); // Esc
      ui.keyDialog.showModal();
      ui.keyInput.focus();
    });
  }
  return keyPrompt;
}

async function api(method, path, body) {
  for (;;) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = `Bearer ${key}`;
    const raw = body instanceof Blob; // a file: sent as it is, its type the Content-Type
    // Every POST says so, an empty one too (docs/protocol.md §15: else 415).
    if (raw) headers["Content-Type"] = body.type;
    else if (body !== undefined || method === "POST") headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined || raw ? body : JSON.stringify(body),
      cache: "no-store",
    });
    let payload = null;
    try {
      payload = await response.json();
    } catch {
      payload = null;
    }
    const error = payload && payload.error ? payload.error : null;
    if (response.status === 401 || (response.status === 403 && error && error.code === "forbidden")) {
      sessionStorage.removeItem(KEY_STORE);
      await askForKey(key ? "The gateway refused that key." : "");
      continue;
    }
    if (!response.ok) {
      throw new HttpError(
        response.status,
        error ? error.code : "http_error",
        error ? error.message : `${method} ${path}: ${response.status}`,
      );
    }
    return payload;
  }
}

// --- the session stream ----------------------------------------------------------------

/**
 * One session's stream, reconnecting until stopped.
 * States (the `status` element's data-state): connecting, live, reconnecting, offline.
 */
class Stream {
  constructor(sessionId, { workers, onFrame, onReset, onState }) {
    this.sessionId = sessionId;
    this.workers = workers;
    this.onFrame = onFrame;
    this.onReset = onReset;
    this.onState = onState;
    this.ws = null;
    this.source = null; // the EventSource, once WebSockets cannot pass
    this.useEvents = false;
    this.cursor = null; // the last event id applied (or the snapshot's)
    this.stopped = false;
    this.everLive = false;
    this.failures = 0; // attempts in a row without progress
    this.retryTimer = 0;
    this.idleTimer = 0;
    this.pinged = false;
    this.state = "idle";
  }

  start() {
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.idleTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000);
    this.dropEvents();
  }

  dropEvents() {
    const source = this.source;
    this.source = null;
    if (source) source.close();
  }

  setState(state, detail = "") {
    this.state = state;
    this.onState(state, detail);
  }

  async connect() {
    if (this.stopped) return;
    this.setState(this.everLive ? "reconnecting" : "connecting");
    let info;
    try {
      info = await api("GET", `sessions/${encodeURIComponent(this.sessionId)}`);
    } catch (error) {
      if (error instanceof HttpError && error.status === 404) {
        this.setState("offline", "session not found");
        return;
      }
      this.retry(`cannot reach the gateway: ${error.message}`);
      return;
    }
    if (this.stopped) return;
    if (this.useEvents) {
      this.connectEvents(info);
      return;
    }
    const ws = new WebSocket(info.ws_url);
    this.ws = ws;
    // Progress (the backoff starts again): an event or a snapshot came, or the
    // connection lasted STABLE_MS. A gateway that accepts and drops at once is not.
    let progressed = false;
    const openedAt = Date.now();
    let opened = false;
    ws.onopen = () => {
      opened = true;
      if (ws === this.ws) this.subscribe();
    };
    ws.onmessage = (message) => {
      if (ws !== this.ws) return;
      this.touch();
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return; // not JSON: nothing a client can do with it
      }
      if (this.receive(frame)) progressed = true;
    };
    ws.onclose = (event) => {
      if (ws !== this.ws) return; // one we dropped ourselves
      this.ws = null;
      clearTimeout(this.idleTimer);
      if (!opened) {
        // The API answered but the WebSocket never opened: the upgrade is refused
        // on the way (section 14). The same stream comes as server-sent events.
        this.useEvents = true;
        this.connect();
        return;
      }
      let reason = "";
      try {
        reason = JSON.parse(event.reason || "{}").code || "";
      } catch {
        reason = "";
      }
      this.closed(event.code, reason, progressed || Date.now() - openedAt >= STABLE_MS);
    };
  }

  /** The gateway closed the stream (a WebSocket close, or an SSE close frame). */
  closed(code, reason, progressed) {
    if (reason === "session_deleted") {
      // DELETE /sessions/{id} (docs/protocol.md §13): nothing to come back to.
      this.setState("offline", "this session was deleted");
      return;
    }
    if (code === 1000 || FINAL_CLOSES.has(reason)) {
      this.setState("offline", `closed ${code}${reason ? ` ${reason}` : ""}`);
      return;
    }
    if (progressed) this.failures = 0;
    this.retry(`closed ${code}${reason ? ` ${reason}` : ""}`);
  }

  /** The stream as server-sent events (docs/doors/sse.md): the subscribe is the query. */
  connectEvents(info) {
    const query = new URLSearchParams({
      attach: info.attach_token,
      filter: JSON.stringify(this.filter()),
      snapshot: String(this.cursor === null),
    });
    if (this.cursor !== null) query.set("since", this.cursor);
    const source = new EventSource(`sessions/${encodeURIComponent(this.sessionId)}/events?${query}`);
    this.source = source;
    let progressed = false;
    const openedAt = Date.now();
    const over = () => {
      this.source = null;
      source.close(); // never the EventSource's own reconnection: its token is used up
      clearTimeout(this.idleTimer);
      return progressed || Date.now() - openedAt >= STABLE_MS;
    };
    source.onopen = () => {
      if (source === this.source) this.touch();
    };
    source.onmessage = (message) => {
      if (source !== this.source) return;
      this.touch();
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      if (frame.type === "close") {
        this.closed(frame.ws_code, frame.code, over());
      } else if (frame.type === "subscribe_error" && SNAPSHOT_INSTEAD.has(frame.code)) {
        over();
        this.cursor = null; // the stream ends after it: ask again, for a snapshot
        this.connect();
      } else if (this.receive(frame)) {
        progressed = true;
      }
    };
    source.onerror = () => {
      if (source !== this.source) return; // one we closed ourselves
      if (over()) this.failures = 0;
      this.retry("the event stream ended");
    };
  }

  filter() {
    return { event_types: null, actors: null, include_worker_sessions: this.workers };
  }

  subscribe() {
    const frame = {
      type: "subscribe",
      filter: this.filter(),
      since: this.cursor,
      snapshot: this.cursor === null,
    };
    if (frame.snapshot) frame.since = null;
    this.send(frame);
    this.touch();
  }

  send(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(frame));
  }

  /** One server frame; true when it is progress (an event or a snapshot). */
  receive(frame) {
    switch (frame.type) {
      case "ping":
        this.send({ type: "pong", nonce: frame.nonce });
        return false;
      case "pong":
        return false;
      case "subscribe_ack":
        this.everLive = true;
        this.setState("live");
        return false;
      case "subscribe_error":
        if (SNAPSHOT_INSTEAD.has(frame.code)) {
          this.cursor = null; // the replay is gone: the state comes whole from a snapshot
          this.subscribe();
          return false;
        }
        this.stopped = true;
        this.setState("offline", `${frame.code}: ${frame.message}`);
        return false;
      case "snapshot":
        this.onReset();
        this.onFrame(frame);
        this.cursor = frame.snapshot_at_event_id;
        return true;
      case "event":
        this.onFrame(frame);
        this.cursor = frame.event.id;
        return true;
      case "error":
        showError(`The gateway said: ${frame.code}: ${frame.message}`);
        return false;
      default:
        return false; // a frame type this page does not know
    }
  }

  /** A frame came: the connection is alive; arm the keepalive again. */
  touch() {
    this.pinged = false;
    clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(() => this.idle(), options.keepaliveMs);
  }

  idle() {
    // Over SSE there is no ping to send, and the gateway's `: ping` comments
    // reach no handler of an EventSource: the browser's own error is the drop.
    if (!this.ws) return;
    if (this.pinged) {
      const ws = this.ws; // silent twice over: a dead peer; drop it and come back
      this.ws = null;
      ws.close(4000, "no answer to ping");
      this.retry("no frame from the gateway");
      return;
    }
    this.pinged = true;
    this.send({ type: "ping", nonce: Math.random().toString(16).slice(2) });
    this.idleTimer = setTimeout(() => this.idle(), options.keepaliveMs);
  }

  retry(why) {
    if (this.stopped) return;
    this.failures += 1;
    const delay = backoffDelay(this.failures, Math.random());
    this.setState(this.everLive ? "reconnecting" : "connecting", `${why}; again in ${(delay / 1000).toFixed(1)} s`);
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = 0;
      this.connect();
    }, delay);
  }

  /** The network is back: skip the rest of the backoff. */
  online() {
    if (this.stopped || this.ws || this.source || !this.retryTimer) return;
    clearTimeout(this.retryTimer);
    this.retryTimer = 0;
    this.connect();
  }

  /** Automation: cut the socket as a network drop would (the page then reconnects). */
  drop() {
    if (this.ws) this.ws.close(4001, "dropped by the page's automation handle");
    if (this.source) {
      this.dropEvents();
      this.retry("dropped by the page's automation handle");
    }
  }
}

// --- the page's state ------------------------------------------------------------------

const page = {
  sessionId: null,
  stream: null,
  reducer: null,
  view: localStorage.getItem(VIEW_STORE) === "simple" ? "simple" : "full",
  workers: localStorage.getItem(WORKERS_STORE) === "1",
  sessions: [],
  renderQueued: false,
  busy: false, // a send in flight
  editing: null, // the user message the composer's text replaces (Edit), or null
  attachments: [], // files uploaded for the next message: {name, file_id, media_type, size} or {name, uploading}
  progress: new Map(), // tool_use_id -> a running tool's last tool.progress (docs/protocol.md §5)
};

// A running tool's progress (tool.progress, streaming-only; a snapshot's session.tool_progress).
function trackProgress(frame) {
  if (frame.type === "snapshot") {
    page.progress = new Map((frame.session.tool_progress || []).map((p) => [p.tool_use_id, p]));
  } else if (frame.type === "event") {
    const { type, payload } = frame.event;
    if (type === "tool.progress") page.progress.set(payload.tool_use_id, payload);
    else if (type === "tool.completed" || type === "tool.failed") page.progress.delete(payload.tool_use_id);
  }
}

function progressLabel(p) {
  const amount = p.total ? `${Math.round((100 * p.progress) / p.total)} %` : `${p.progress}`;
  return p.message ? `${amount}: ${p.message}` : amount;
}

function newReducer(sessionId) {
  return new Reducer(sessionId);
}

function openSession(sessionId) {
  if (page.stream) page.stream.stop();
  page.sessionId = sessionId;
  page.reducer = sessionId ? newReducer(sessionId) : null;
  page.stream = null;
  page.attachments = []; // a file is a session's: it cannot go with another's turn
  drawAttachments();
  forgetFiles(sessionId);
  ui.title.textContent = sessionId || "No session";
  ui.title.title = sessionId || "";
  for (const button of ui.sessions.querySelectorAll("button[data-session-id]")) {
    button.setAttribute("aria-current", String(button.dataset.sessionId === sessionId));
  }
  clearThread();
  stopEditing();
  if (!sessionId) {
    setStatus("idle", "");
    render();
    return;
  }
  const stream = new Stream(sessionId, {
    workers: page.workers,
    onFrame: (frame) => {
      if (stream !== page.stream) return;
      try {
        page.reducer.apply(frame);
        trackProgress(frame);
      } catch (error) {
        // A move the contract does not allow: a server bug. Say so, start over from a snapshot.
        showError(`Inconsistent stream (${error.message}); reloading the session.`);
        stream.cursor = null;
        if (stream.ws) stream.ws.close(4002, "inconsistent stream");
      }
      if (frame.type === "event" && LISTED_CHANGES.has(frame.event.type)) refreshSessionsSoon();
      queueRender();
    },
    onReset: () => {
      if (stream === page.stream) {
        page.reducer = newReducer(sessionId);
        page.progress = new Map();
      }
    },
    onState: (state, detail) => {
      if (stream === page.stream) setStatus(state, detail);
    },
  });
  page.stream = stream;
  window.gateway.stream = stream;
  stream.start();
  render();
  ui.prompt.focus();
}

function setStatus(state, detail) {
  const label = {
    idle: "Not connected",
    connecting: "Connecting…",
    live: "Live",
    reconnecting: "Reconnecting…",
    offline: "Offline",
  }[state];
  ui.status.dataset.state = state;
  ui.status.textContent = label;
  ui.status.title = detail || label;
  updateComposer();
}

// --- drawing -------------------------------------------------------------------------------

function queueRender() {
  if (page.renderQueued) return;
  page.renderQueued = true;
  const run = () => {
    page.renderQueued = false;
    render();
  };
  if (document.hidden) setTimeout(run, 50);
  else requestAnimationFrame(run);
}

function clearThread() {
  ui.thread.replaceChildren(ui.empty);
  ui.activity.replaceChildren();
  ui.activity.hidden = true;
}

function currentView() {
  if (!page.reducer) return null;
  return page.view === "simple" ? simpleView(page.reducer) : fullView(page.reducer, { workers: page.workers });
}

function render() {
  const view = currentView();
  const stick = ui.thread.scrollHeight - ui.thread.scrollTop - ui.thread.clientHeight < 60;
  const items = view ? messagesOf(view) : [];
  ui.empty.hidden = items.length > 0;
  ui.empty.textContent = page.sessionId
    ? "No messages yet. Say something below."
    : "Pick a session on the left, or start a new one.";
  reconcile(items);
  drawEarlier(items.length > 0 && page.reducer !== null && page.reducer.hasMore);
  drawActivity(view);
  updateComposer();
  if (stick) ui.thread.scrollTop = ui.thread.scrollHeight;
}

// docs/protocol.md §15: a snapshot holds the newest messages that fit; older ones are paged in.
let earlier = null;

function drawEarlier(shown) {
  if (!shown) {
    if (earlier) earlier.remove();
    return;
  }
  if (!earlier) {
    earlier = el(
      "div",
      { class: "earlier", "data-testid": "earlier" },
      el("span", { text: "Earlier messages are not shown. " }),
      el("button", { type: "button", "data-testid": "load-earlier", text: "Show earlier", onclick: loadEarlier }),
    );
  }
  if (earlier.parentNode !== ui.thread || ui.thread.firstChild !== earlier) ui.thread.prepend(earlier);
}

async function loadEarlier(event) {
  const reducer = page.reducer;
  const sessionId = page.sessionId;
  if (!reducer || !reducer.oldestMessageId) return;
  event.target.disabled = true;
  try {
    const query = `before=${encodeURIComponent(reducer.oldestMessageId)}&limit=50`;
    const older = await api("GET", `sessions/${encodeURIComponent(sessionId)}/messages?${query}`);
    if (reducer === page.reducer) reducer.prependHistory(older.messages, older.has_more);
    render();
  } catch (error) {
    showError(`Could not load earlier messages: ${error.message}`);
  } finally {
    event.target.disabled = false;
  }
}

/** A message a snapshot sent cut (section 15), fetched whole. */
async function loadWhole(messageId, button) {
  const reducer = page.reducer;
  button.disabled = true;
  try {
    const whole = await api("GET", `sessions/${encodeURIComponent(page.sessionId)}/messages/${encodeURIComponent(messageId)}`);
    if (reducer === page.reducer) reducer.replaceMessage(whole);
    render();
  } catch (error) {
    button.disabled = false;
    showError(`Could not load the whole message: ${error.message}`);
  }
}

function truncatedMark(block, messageId, whole) {
  if (!block.truncated) return null;
  return el(
    "div",
    { class: "truncated", "data-testid": "truncated" },
    el("span", { text: whole ? "… (cut to fit; " : "… (cut to fit; whole once it ends)" }),
    whole ? el("button", { type: "button", text: "show all", onclick: (e) => loadWhole(messageId, e.target) }) : null,
    whole ? el("span", { text: ")" }) : null,
  );
}

// What each drawn message element was drawn from (its view, as JSON).
const drawnFrom = new WeakMap();

/** Keep one element per message, keyed; rebuild only the messages whose view changed. */
function reconcile(items) {
  const existing = new Map();
  for (const node of ui.thread.querySelectorAll(":scope > [data-key]")) existing.set(node.dataset.key, node);
  let previous = ui.empty;
  const keep = new Set();
  for (const item of items) {
    const signature = JSON.stringify(item);
    let node = existing.get(item.key);
    if (!node || drawnFrom.get(node) !== signature) {
      const fresh = drawMessage(item);
      drawnFrom.set(fresh, signature);
      if (node) node.replaceWith(fresh);
      node = fresh;
    }
    keep.add(item.key);
    if (previous.nextSibling !== node) previous.after(node);
    previous = node;
  }
  for (const [key, node] of existing) if (!keep.has(key)) node.remove();
}

function drawMessage(item) {
  if (item.role === "context") return drawCompaction(item);
  if (item.role === "queued") return drawQueued(item);
  const head = el(
    "div",
    { class: "message-head" },
    el("span", { class: "role", text: item.worker ? (item.role === "user" ? "task" : "worker") : item.role }),
    item.status !== "complete" ? el("span", { class: `badge ${item.status}`, text: statusLabel(item.status) }) : null,
    item.steered ? el("span", { class: "badge steered", text: "steered", title: "The running turn took it" }) : null,
    ...(item.role === "user" && !item.worker && item.id ? rewindActions(item) : []),
  );
  return el(
    "article",
    {
      class: `message${item.worker ? " worker" : ""}`,
      "data-testid": item.worker ? "worker-message" : "message",
      "data-role": item.role,
      "data-status": item.status,
      "data-key": item.key,
      "data-message-id": item.id || null,
      "data-session-id": item.sessionId || null,
      "data-steered": item.steered ? "true" : null,
    },
    head,
    el(
      "div",
      { class: "blocks" },
      item.blocks.flatMap((block, index) => [
        drawBlock(block, `${item.key}:${index}`),
        // A finished message is whole by id; a streaming one once its message.complete comes.
        truncatedMark(block, item.id, item.status !== "in_progress" && !item.worker),
      ]),
    ),
  );
}

/** A queued turn (docs/protocol.md §2 "A busy session"): its message, its place, its Cancel. */
function drawQueued(item) {
  return el(
    "article",
    {
      class: "message queued",
      "data-testid": "queued",
      "data-role": "user",
      "data-status": "queued",
      "data-key": item.key,
      "data-turn-id": item.turnId,
      "data-message-id": item.id,
      "data-position": String(item.position),
    },
    el(
      "div",
      { class: "message-head" },
      el("span", { class: "role", text: "user" }),
      el("span", { class: "badge queued", text: item.position === 1 ? "queued · next" : `queued · ${item.position}` }),
      el("button", {
        type: "button",
        "data-testid": "cancel-queued",
        title: "Take it out of the queue: it never starts",
        text: "Cancel",
        onclick: (event) => cancelQueued(item.turnId, event.target),
      }),
    ),
    el("div", { class: "blocks" }, el("div", { class: "text", "data-testid": "text", text: item.text })),
  );
}

/** A compaction (docs/protocol.md §12): one quiet line; its summary folded, when known. */
function drawCompaction(item) {
  const block = item.blocks[0] || { replaces: 0, summary: "" };
  const count = block.replaces;
  const line = `Context compacted: ${count} message${count === 1 ? "" : "s"} summarised for the model (kept here)`;
  return el(
    "div",
    {
      class: "compaction",
      "data-testid": "compaction",
      "data-role": "context",
      "data-key": item.key,
      "data-message-id": item.id || null,
      "data-replaces": String(count),
    },
    block.summary
      ? el("details", {}, el("summary", { text: line }), el("div", { class: "text", text: block.summary }))
      : el("span", { text: line }),
  );
}

function statusLabel(status) {
  if (status === "in_progress") return page.view === "simple" ? "working…" : "writing…";
  return { cancelled: "cancelled", error: "error" }[status] || status;
}

// Thinking blocks the reader unfolded stay unfolded when their message is drawn again.
const unfolded = new Set();

function drawBlock(block, key) {
  switch (block.kind) {
    case "text":
      return el("div", { class: `text${block.open ? " open" : ""}`, "data-testid": "text", text: block.text });
    case "thinking":
      // Open while it streams; then folded to one line (click to read it all).
      return el(
        "details",
        {
          class: "thinking",
          "data-testid": "thinking",
          open: block.open || unfolded.has(key) || null,
          ontoggle: (event) => {
            if (block.open) return;
            if (event.target.open) unfolded.add(key);
            else unfolded.delete(key);
          },
        },
        el(
          "summary",
          {},
          el("span", { class: "label", text: block.redacted ? "Thinking (redacted)" : block.open ? "Thinking…" : "Thinking" }),
          block.open || block.redacted ? null : el("span", { class: "preview", text: block.text }),
        ),
        el("div", { class: "text", text: block.redacted ? "" : block.text }),
      );
    case "tool":
      return drawTool(block);
    case "file":
      return drawFile(block);
    default:
      return el("div", { class: "text", text: block.text || "" });
  }
}

const TOOL_STATUS = {
  streaming: "writing its input…",
  pending: "queued",
  awaiting_approval: "needs your approval",
  running: "running…",
  completed: "done",
  failed: "failed",
  not_run: "not run",
};

function drawTool(block) {
  const status = block.status; // reducer.js: streaming, pending, awaiting_approval, running, completed, failed, not_run
  const progress = block.progress;
  const badge = progress ? `${TOOL_STATUS[status]} ${progressLabel(progress)}` : TOOL_STATUS[status] || status;
  const tool = el(
    "div",
    { class: "tool", "data-testid": "tool", "data-tool-name": block.name, "data-tool-status": status },
    el(
      "div",
      { class: "tool-head" },
      el("span", { class: "tool-name", text: block.name }),
      el("span", { class: `badge ${status}`, "data-testid": "tool-badge", text: badge }),
    ),
    el("pre", { class: "input", text: pretty(block.input) }),
  );
  if (block.result !== null && block.result !== undefined) {
    tool.append(el("pre", { class: `result ${status}`, "data-testid": "tool-result", text: pretty(block.result) }));
  }
  if (block.files && block.files.length > 0) tool.append(el("div", { class: "files" }, block.files.map(drawFile)));
  for (const permission of block.permissions) tool.append(drawPermission(permission));
  if (block.worker) {
    const worker = block.worker;
    tool.append(
      el(
        "div",
        { class: "worker-thread", "data-testid": "worker", "data-session-id": worker.sessionId },
        el("div", { class: "worker-head", text: `Worker session ${worker.sessionId}${worker.running ? " · running" : ""}` }),
        worker.items.map(drawMessage),
      ),
    );
  }
  return tool;
}

function permissionPath(permission) {
  // A worker's request is answered with the session that asked (docs/protocol.md sections 5, 6).
  const sessionId = permission.session_id || permission.sessionId || page.sessionId;
  return `sessions/${encodeURIComponent(sessionId)}/permissions/${encodeURIComponent(permission.perm_id)}`;
}

function drawPermission(permission) {
  if (permission.kind === "elicitation") return drawElicitation(permission);
  const decide = (decision) => async (event) => {
    const buttons = event.target.closest(".permission").querySelectorAll("button");
    for (const button of buttons) button.disabled = true;
    try {
      await api("POST", permissionPath(permission), { decision });
    } catch (error) {
      showError(`Could not ${decision}: ${error.message}`);
      for (const button of buttons) button.disabled = false;
    }
  };
  // An MCP server's URL to open, or its sampling request (section 11): its message first.
  const given = permission.kind === "elicitation_url" ? String(permission.input.url || "") : "";
  const url = /^https?:\/\//i.test(given) ? given : ""; // the gateway let no other through
  const ask = url
    ? el("span", { class: "ask" }, el("code", { text: permission.tool_name }), ` asks: ${permission.message || ""} `, el("a", { href: url, target: "_blank", rel: "noopener noreferrer", "data-testid": "elicitation-url", text: url }))
    : permission.kind === "sampling"
      ? el("span", { class: "ask" }, el("code", { text: permission.tool_name }), ` ${permission.message || ""}: `, el("code", { text: visible(JSON.stringify(permission.input)) }))
      : el("span", { class: "ask" }, "Allow ", el("code", { text: permission.tool_name }), " to run with ", el("code", { text: visible(JSON.stringify(permission.input)) }), "?");
  return el(
    "div",
    { class: "permission", "data-testid": "permission", "data-perm-id": permission.perm_id },
    ask,
    el("button", { type: "button", "data-testid": "approve", onclick: decide("allow") }, "Approve"),
    el("button", { type: "button", class: "danger", "data-testid": "deny", onclick: decide("deny") }, "Deny"),
  );
}

/** One input of an elicitation's form, for a property of its requested_schema. */
function formInput(name, schema, required) {
  const attrs = { name, "data-field": name, required: required || null };
  if (Array.isArray(schema.enum)) {
    return el(
      "select",
      attrs,
      required ? null : el("option", { value: "", text: "" }),
      ...schema.enum.map((choice, index) => el("option", { value: String(index), text: String(choice) })),
    );
  }
  switch (schema.type) {
    case "boolean":
      return el("input", { ...attrs, type: "checkbox", required: null, checked: schema.default === true || null });
    case "number":
    case "integer":
      return el("input", {
        ...attrs,
        type: "number",
        step: schema.type === "integer" ? "1" : "any",
        min: schema.minimum ?? null,
        max: schema.maximum ?? null,
      });
    default:
      return el("input", {
        ...attrs,
        type: "text",
        minlength: schema.minLength ?? null,
        maxlength: schema.maxLength ?? null,
      });
  }
}

/** The form's answers as the schema's values; an error message if one is missing or wrong. */
function formContent(form, schema) {
  const content = {};
  const required = new Set(schema.required || []);
  for (const [name, property] of Object.entries(schema.properties || {})) {
    const input = form.querySelector(`[data-field="${CSS.escape(name)}"]`);
    if (property.type === "boolean" && !Array.isArray(property.enum)) {
      content[name] = input.checked;
      continue;
    }
    const raw = input.value;
    if (raw === "") {
      if (required.has(name)) return { error: `${property.title || name} is required` };
      continue;
    }
    if (Array.isArray(property.enum)) content[name] = property.enum[Number(raw)];
    else if (property.type === "integer" || property.type === "number") {
      const value = Number(raw);
      if (!Number.isFinite(value) || (property.type === "integer" && !Number.isInteger(value))) {
        return { error: `${property.title || name}: ${property.type === "integer" ? "a whole number" : "a number"}` };
      }
      if (property.minimum !== undefined && value < property.minimum) return { error: `${property.title || name}: at least ${property.minimum}` };
      if (property.maximum !== undefined && value > property.maximum) return { error: `${property.title || name}: at most ${property.maximum}` };
      content[name] = value;
    } else content[name] = raw;
  }
  return { content };
}

/** An MCP server's question (docs/protocol.md §11): Submit allows with content, Decline denies. */
function drawElicitation(permission) {
  const schema = permission.requested_schema || { type: "object", properties: {} };
  const required = new Set(schema.required || []);
  const problem = el("p", { class: "form-error", "data-testid": "elicitation-error", hidden: true });
  const answer = async (form, body) => {
    const buttons = form.querySelectorAll("button");
    for (const button of buttons) button.disabled = true;
    try {
      await api("POST", permissionPath(permission), body);
    } catch (error) {
      showError(`Could not answer: ${error.message}`);
      for (const button of buttons) button.disabled = false;
    }
  };
  const form = el(
    "form",
    {
      class: "permission elicitation",
      "data-testid": "elicitation",
      "data-perm-id": permission.perm_id,
      novalidate: true,
      onsubmit: (event) => {
        event.preventDefault();
        const result = formContent(event.target, schema);
        problem.hidden = !result.error;
        problem.textContent = result.error || "";
        if (!result.error) answer(event.target, { decision: "allow", content: result.content });
      },
    },
    el("p", { class: "ask" }, el("code", { text: permission.tool_name }), " asks: ", el("span", { "data-testid": "elicitation-message", text: permission.message || "" })),
    ...Object.entries(schema.properties || {}).map(([name, property]) =>
      el(
        "label",
        { class: "field" },
        el("span", { text: `${property.title || name}${required.has(name) ? " *" : ""}` }),
        formInput(name, property, required.has(name)),
        property.description ? el("small", { text: property.description }) : null,
      ),
    ),
    problem,
    el("button", { type: "submit", "data-testid": "elicitation-submit" }, "Submit"),
    el(
      "button",
      {
        type: "button",
        class: "danger",
        "data-testid": "elicitation-decline",
        onclick: (event) => answer(event.target.closest("form"), { decision: "deny" }),
      },
      "Decline",
    ),
  );
  return form;
}

function drawActivity(view) {
  const activity = view ? activityOf(view) : null;
  if (!activity) {
    ui.activity.hidden = true;
    ui.activity.replaceChildren();
    return;
  }
  const signature = JSON.stringify(activity);
  if (drawnFrom.get(ui.activity) === signature && !ui.activity.hidden) return;
  drawnFrom.set(ui.activity, signature);
  ui.activity.replaceChildren(
    activity.line ? el("div", { class: "line", "data-testid": "activity-line", text: activity.line }) : null,
    ...(activity.permissions || []).map(drawPermission),
  );
  ui.activity.hidden = false;
}

// --- adapting the reducer's views to what is drawn ----------------------------------------
// (messagesOf, activityOf, turnOf: see the end of this file)

// --- edit and regenerate (docs/protocol.md §2 "Edit and regenerate") ---------------------------

/** A user message's Edit and Retry buttons. */
function rewindActions(item) {
  const text = item.blocks.filter((b) => b.kind === "text").map((b) => b.text).join("\n");
  return [
    el("span", { class: "spacer" }),
    el("button", {
      type: "button",
      class: "link",
      "data-testid": "edit-message",
      title: "Put this message back in the composer; sending it replaces it, and what came after",
      text: "Edit",
      onclick: () => startEditing(item.id, text),
    }),
    el("button", {
      type: "button",
      class: "link",
      "data-testid": "retry-message",
      title: "Send this message again for a new answer, in place of what came after it",
      text: "Retry",
      onclick: () => submit(text, item.id),
    }),
  ];
}

let editingNote = null;

function startEditing(messageId, text) {
  page.editing = messageId;
  ui.prompt.value = text;
  if (!editingNote) {
    editingNote = el(
      "div",
      { class: "editing", "data-testid": "editing" },
      el("span", { text: "Editing a message: sending replaces it and what came after. " }),
      el("button", { type: "button", class: "link", "data-testid": "cancel-edit", text: "Cancel edit", onclick: () => {
        stopEditing();
        ui.prompt.value = "";
        updateComposer();
      } }),
    );
  }
  ui.composer.before(editingNote);
  updateComposer();
  ui.prompt.focus();
}

function stopEditing() {
  page.editing = null;
  if (editingNote) editingNote.remove();
}

// --- the composer -----------------------------------------------------------------------------

const IDLE_HINT = "Message the agent. Enter sends, Shift+Enter is a new line, Esc cancels the turn.";
const BUSY_HINT = "A turn is running. Enter queues this for after it; Ctrl+Enter (Steer) gives it to the running turn.";

/** A turn runs, or turns wait to start (docs/protocol.md §2 "A busy session"). */
function sessionBusy() {
  return Boolean(page.reducer && (page.reducer.runningTurnId !== null || page.reducer.queued.size > 0));
}

function updateComposer() {
  const turn = page.reducer ? turnOf(page.reducer) : null;
  const inFlight = Boolean(turn && turn.inFlight);
  const busy = sessionBusy();
  const ready = Boolean(page.sessionId) && !page.busy;
  const uploading = page.attachments.some((a) => a.uploading);
  const typed = (Boolean(ui.prompt.value.trim()) || page.attachments.length > 0) && !uploading;
  ui.send.disabled = !ready || !typed;
  ui.attach.disabled = !page.sessionId;
  ui.send.dataset.mode = busy ? "queue" : "send";
  ui.send.textContent = busy ? "Queue" : "Send";
  ui.send.title = busy ? "Send it once the running turn and the queued ones have ended (Enter)" : "Send (Enter)";
  ui.steer.hidden = !inFlight;
  ui.steer.disabled = !ready || !inFlight || !typed;
  ui.cancel.disabled = !page.sessionId || !inFlight;
  ui.prompt.disabled = !page.sessionId;
  ui.prompt.placeholder = busy ? BUSY_HINT : IDLE_HINT;
}

/** Send the prompt: a turn, or while the session is busy `if_busy` queue (or `ifBusy`). */
async function send(ifBusy = null) {
  const text = ui.prompt.value;
  const files = page.attachments;
  if (!page.sessionId || (!text.trim() && files.length === 0) || page.busy) return;
  if (files.some((a) => a.uploading)) return;
  // Attached files first, then the text (docs/protocol.md §2 "Files": blocks by file_id).
  const content =
    files.length === 0
      ? text
      : [
          ...files.map((a) => ({ type: fileKind(a.media_type), file_id: a.file_id })),
          ...(text.trim() ? [{ type: "text", text }] : []),
        ];
  // An edit is sent now (a rewind starts now or not at all); else, while busy, queued.
  const mode = page.editing ? null : ifBusy || (sessionBusy() ? "queue" : null);
  await submit(content, page.editing, true, mode);
}

/** A turn: `content`, rewinding to `rewindTo` when set, `if_busy` `mode` when set;
 * `fromComposer` clears the composer once sent. */
async function submit(content, rewindTo, fromComposer = false, mode = null) {
  if (!page.sessionId || page.busy) return;
  page.busy = true;
  updateComposer();
  const body = { content };
  if (rewindTo) body.rewind_to = rewindTo;
  if (mode) body.if_busy = mode;
  try {
    const accepted = await api("POST", `sessions/${encodeURIComponent(page.sessionId)}/turns`, body);
    if (fromComposer) {
      ui.prompt.value = "";
      stopEditing();
      page.attachments = [];
      drawAttachments();
    }
    if (accepted && accepted.steered) {
      showError("Sent to the running turn: it takes it before its next step.", "info");
    }
  } catch (error) {
    const why = {
      turn_in_progress: "A turn is still running: wait, or cancel it (Esc).",
      queue_full: `Not queued: ${error.message}`,
    }[error.code];
    showError(why || `Not sent: ${error.message}`);
  } finally {
    page.busy = false;
    updateComposer();
    ui.prompt.focus();
  }
}

/** A queued turn's Cancel: it leaves the queue and never starts (docs/protocol.md §2). */
async function cancelQueued(turnId, button) {
  button.disabled = true;
  try {
    await api(
      "POST",
      `sessions/${encodeURIComponent(page.sessionId)}/turns/${encodeURIComponent(turnId)}/cancel`,
      { reason: "user" },
    );
  } catch (error) {
    button.disabled = false;
    if (error.code !== "turn_not_found") showError(`Could not cancel: ${error.message}`);
  }
}

async function cancelTurn() {
  const turn = page.reducer ? turnOf(page.reducer) : null;
  if (!page.sessionId || !turn || !turn.inFlight) return;
  ui.cancel.disabled = true;
  try {
    await api(
      "POST",
      `sessions/${encodeURIComponent(page.sessionId)}/turns/${encodeURIComponent(turn.turnId)}/cancel`,
      { reason: "user" },
    );
  } catch (error) {
    if (error.code !== "turn_not_in_flight") showError(`Could not cancel: ${error.message}`);
  }
}

// Events after which the sessions list (turn counts, running dots) is out of date.
const LISTED_CHANGES = new Set(["turn.started", "turn.completed", "turn.cancelled", "delegate.started"]);
let refreshTimer = 0;
function refreshSessionsSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(loadSessions, 300);
}

// --- sessions ---------------------------------------------------------------------------------

async function loadSessions() {
  let listing;
  try {
    listing = await api("GET", "sessions?limit=100");
  } catch (error) {
    showError(`Could not list sessions: ${error.message}`);
    return;
  }
  page.sessions = listing.sessions;
  drawSessions();
}

function drawSessions() {
  const entries = page.sessions.filter((entry) => page.workers || !entry.session.parent_session_id);
  // Workers right under their parent, when shown.
  const byParent = new Map();
  for (const entry of entries) {
    const parent = entry.session.parent_session_id || "";
    if (!byParent.has(parent)) byParent.set(parent, []);
    byParent.get(parent).push(entry);
  }
  const listed = new Set(entries.map((entry) => entry.session.id));
  const ordered = [];
  const visit = (entry, depth) => {
    ordered.push([entry, depth]);
    for (const child of byParent.get(entry.session.id) || []) visit(child, depth + 1);
  };
  for (const entry of entries) {
    const parent = entry.session.parent_session_id;
    if (!parent || !listed.has(parent)) visit(entry, parent ? 1 : 0);
  }
  ui.sessions.replaceChildren(
    ...ordered.map(([entry, depth]) => {
      const s = entry.session;
      const running = s.current_turn_status === "in_flight";
      return el(
        "li",
        { class: depth ? "worker" : null },
        el(
          "button",
          {
            type: "button",
            "data-testid": "session-item",
            "data-session-id": s.id,
            "aria-current": String(s.id === page.sessionId),
            title: s.id,
            onclick: () => {
              location.hash = s.id;
            },
          },
          el("span", { class: "sid" }, running ? el("span", { class: "live-dot", text: "● " }) : null, shortId(s.id)),
          el("span", {
            class: "meta",
            text: `${depth ? "worker · " : ""}${s.turn_count} turn${s.turn_count === 1 ? "" : "s"} · ${ago(entry.created_at)}`,
          }),
        ),
      );
    }),
  );
}

async function newSession() {
  ui.newSession.disabled = true;
  try {
    const agent = ui.agentPicker.hidden ? "" : ui.agentPicker.value;
    const created = await api("POST", "sessions", agent ? { agent } : {});
    await loadSessions();
    location.hash = created.session_id;
  } catch (error) {
    showError(`Could not create a session: ${error.message}`);
  } finally {
    ui.newSession.disabled = false;
  }
}

/** The agent picker, from GET /agents (docs/protocol.md §11); hidden without that route. */
async function loadAgents() {
  let answer;
  try {
    answer = await api("GET", "agents");
  } catch (error) {
    ui.agentPicker.hidden = true;
    if (!(error instanceof HttpError && error.status === 404)) showError(`Could not list the agents: ${error.message}`);
    return;
  }
  const agents = (answer && answer.agents) || [];
  ui.agentPicker.replaceChildren(
    ...agents.map((agent) =>
      el("option", {
        value: agent.name,
        text: `${agent.name} · ${agent.model}`,
        title: `${agent.runtime}, ${(agent.tools || []).length} tools`,
        selected: agent.default || null,
      }),
    ),
  );
  ui.agentPicker.hidden = agents.length === 0;
}

function sessionFromHash() {
  const id = decodeURIComponent(location.hash.slice(1));
  return /^[A-Za-z0-9_-]+$/.test(id) ? id : null;
}

// --- wiring -----------------------------------------------------------------------------------

function setView(view) {
  page.view = view;
  localStorage.setItem(VIEW_STORE, view);
  ui.viewToggle.dataset.view = view;
  ui.viewToggle.textContent = view === "simple" ? "View: simple" : "View: full";
  ui.viewToggle.setAttribute("aria-pressed", String(view === "simple"));
  ui.thread.replaceChildren(ui.empty); // every message is drawn anew in the other view
  render();
}

ui.viewToggle.addEventListener("click", () => setView(page.view === "full" ? "simple" : "full"));
ui.workers.checked = page.workers;
ui.workers.addEventListener("change", () => {
  page.workers = ui.workers.checked;
  localStorage.setItem(WORKERS_STORE, page.workers ? "1" : "0");
  drawSessions();
  if (page.sessionId) openSession(page.sessionId); // a new filter: attach again, from a snapshot
});
ui.newSession.addEventListener("click", newSession);
ui.refresh.addEventListener("click", loadSessions);
ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.cancel.addEventListener("click", cancelTurn);
ui.steer.addEventListener("click", () => send("steer"));
ui.prompt.addEventListener("input", updateComposer);
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    const steer = (event.ctrlKey || event.metaKey) && page.reducer && page.reducer.runningTurnId !== null;
    send(steer ? "steer" : null);
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !ui.keyDialog.open) {
    event.preventDefault();
    cancelTurn();
  }
});
ui.status.addEventListener("click", () => {
  if (page.sessionId && page.stream && page.stream.state === "offline") openSession(page.sessionId);
});
window.addEventListener("online", () => {
  if (page.stream) page.stream.online();
});
window.addEventListener("hashchange", () => {
  const id = sessionFromHash();
  if (id !== page.sessionId) openSession(id);
});

window.gateway = {
  options,
  stream: null,
  state: () => page.reducer,
  view: () => currentView(),
  backoffDelay,
};

setView(page.view);
loadAgents();
loadSessions().then(() => openSession(sessionFromHash()));


// --- files (docs/protocol.md §2 "Files") ---------------------------------------------------
// Attach uploads each chosen file (POST /sessions/{id}/files, the key header as every call)
// and the next message carries them as image or document blocks by file_id. A message's
// files are shown from the file route: fetched with the key, then an <img> on a blob URL
// (sized by CSS), or a label with a Download button; never their bytes as HTML.

const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
const BY_EXTENSION = {
  png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif", webp: "image/webp",
  pdf: "application/pdf", txt: "text/plain", md: "text/markdown", markdown: "text/markdown", csv: "text/csv",
};

function fileKind(mediaType) {
  return IMAGE_TYPES.has(mediaType) ? "image" : "document";
}

/** A chosen file's media type: the browser's, else by its extension (a .md often has none). */
function mediaTypeOf(file) {
  const known = Object.values(BY_EXTENSION);
  if (known.includes(file.type)) return file.type;
  return BY_EXTENSION[(file.name.split(".").pop() || "").toLowerCase()] || file.type || "";
}

async function attachFiles(files) {
  const sessionId = page.sessionId;
  for (const file of files) {
    const pending = { name: file.name, uploading: true };
    page.attachments = [...page.attachments, pending];
    drawAttachments();
    try {
      const blob = new Blob([file], { type: mediaTypeOf(file) });
      const stored = await api("POST", `sessions/${encodeURIComponent(sessionId)}/files`, blob);
      if (page.sessionId !== sessionId) return; // another session was opened meanwhile
      page.attachments = page.attachments.map((a) => (a === pending ? { name: file.name, ...stored } : a));
    } catch (error) {
      page.attachments = page.attachments.filter((a) => a !== pending);
      showError(`Not attached: ${file.name}: ${error.message}`);
    }
    drawAttachments();
  }
}

function drawAttachments() {
  ui.attachments.hidden = page.attachments.length === 0;
  ui.attachments.replaceChildren(
    ...page.attachments.map((a) =>
      el(
        "span",
        { class: `attachment${a.uploading ? " uploading" : ""}`, "data-testid": "attachment", "data-file-id": a.file_id || null },
        a.uploading ? `${a.name} (uploading…)` : `${a.name} · ${humanSize(a.size)}`,
        el("button", {
          type: "button",
          title: "Do not send this file",
          "aria-label": `Remove ${a.name}`,
          text: "×",
          onclick: () => {
            page.attachments = page.attachments.filter((x) => x !== a);
            drawAttachments();
          },
        }),
      ),
    ),
  );
  updateComposer();
}

// Blob URLs of the files fetched, by session and file id (a file id names its bytes: they
// never change), so a message drawn again shows its image at once.
const fileUrls = new Map();

function fileUrl(sessionId, fileId) {
  const key = `${sessionId}/${fileId}`;
  if (!fileUrls.has(key)) {
    const path = `sessions/${encodeURIComponent(sessionId)}/files/${encodeURIComponent(fileId)}`;
    const loading = fetchFile(path).then((blob) => URL.createObjectURL(blob));
    loading.catch(() => fileUrls.delete(key)); // tried again when drawn again
    fileUrls.set(key, loading);
  }
  return fileUrls.get(key);
}

/** Release the blob URLs of other sessions' files (their images are no longer drawn). */
function forgetFiles(sessionId) {
  for (const [key, loading] of fileUrls) {
    if (key.startsWith(`${sessionId}/`)) continue;
    fileUrls.delete(key);
    loading.then(
      (url) => URL.revokeObjectURL(url),
      () => {},
    );
  }
}

async function fetchFile(path) {
  const headers = {};
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { headers });
  if (!response.ok) throw new HttpError(response.status, "http_error", `GET ${path}: ${response.status}`);
  return response.blob();
}

function drawFile(file) {
  const label = fileLine(file);
  if (file.type === "image") {
    const img = el("img", { alt: label, title: label, "data-testid": "image", "data-file-id": file.file_id });
    fileUrl(file.sessionId, file.file_id).then(
      (url) => {
        img.src = url;
      },
      () => {
        img.alt = `${label} (could not be loaded)`;
      },
    );
    return el("figure", { class: "file image", "data-testid": "file", "data-file-type": "image" }, img);
  }
  const download = el("button", {
    type: "button",
    text: "Download",
    onclick: async () => {
      try {
        const url = await fileUrl(file.sessionId, file.file_id);
        el("a", { href: url, download: `${file.file_id}.${extensionOf(file.media_type)}` }).click();
      } catch (error) {
        showError(`Could not download: ${error.message}`);
      }
    },
  });
  return el(
    "div",
    { class: "file", "data-testid": "file", "data-file-type": file.type, "data-file-id": file.file_id },
    el("span", { class: "file-label", text: label }),
    download,
  );
}

function extensionOf(mediaType) {
  return Object.keys(BY_EXTENSION).find((ext) => BY_EXTENSION[ext] === mediaType) || "bin";
}

/** A file view (reducer.js) as the block drawn for it, with the session whose route serves it. */
function fileBlock(file, sessionId) {
  return { kind: "file", type: file.type, file_id: file.file_id, media_type: file.media_type, size: file.size, sessionId };
}

ui.attach.addEventListener("click", () => ui.attachInput.click());
ui.attachInput.addEventListener("change", () => {
  const files = [...ui.attachInput.files];
  ui.attachInput.value = ""; // the same file may be chosen again
  if (page.sessionId && files.length > 0) attachFiles(files);
});

// --- adapters: the reducer's views as the items drawn above ----------------------------------
// The view shapes are documented at the top of reducer.js.

/** The messages of a view, each {key, id, role, status, worker, sessionId, blocks}; then
 * the queued turns, each {key, id, role: "queued", turnId, position, text}. */
function messagesOf(view) {
  return [...conversationOf(view), ...(view.queued || []).map(queuedItem)];
}

function queuedItem(queued) {
  return {
    key: `q:${queued.turn_id}`,
    id: queued.message_id,
    role: "queued",
    status: "queued",
    turnId: queued.turn_id,
    position: queued.position,
    text: queued.text,
  };
}

function conversationOf(view) {
  if (page.view === "simple") {
    return view.thread.map((entry) =>
      entry.role === "context"
        ? {
            key: `s:c:${entry.message_id}`,
            id: entry.message_id,
            role: "context",
            status: entry.status,
            worker: false,
            sessionId: page.sessionId,
            blocks: [{ kind: "compaction", replaces: entry.replaces, summary: "" }],
          }
        : {
            key: entry.role === "user" ? `s:u:${entry.message_id}` : `s:a:${entry.turn_id || entry.message_id}`,
            id: entry.message_id,
            role: entry.role,
            status: entry.status,
            steered: entry.steered === true,
            worker: false,
            sessionId: page.sessionId,
            blocks: [
              ...(entry.files || []).map((f) => fileBlock(f, page.sessionId)),
              ...(entry.files && !entry.text ? [] : [{ kind: "text", text: entry.text, open: entry.status === "in_progress" }]),
            ],
          },
    );
  }
  const permissions = new Map(view.permissions.map((p) => [p.perm_id, p]));
  const workers = new Map();
  const unlinked = [];
  for (const worker of view.workers || []) {
    if (worker.tool_use_id) workers.set(worker.tool_use_id, worker);
    else unlinked.push(worker);
  }
  const items = fullItems(view.session_id, view.messages, permissions, workers, false);
  for (const worker of unlinked) items.push(...fullItems(worker.session_id, worker.messages, permissions, workers, true));
  return items;
}

function fullItems(sessionId, messages, permissions, workers, worker) {
  return messages.map((m) => ({
    key: `f:${m.id}`,
    id: m.id,
    role: m.role,
    status: m.status,
    steered: m.steered === true,
    worker,
    sessionId,
    blocks: m.blocks.map((b) => {
      switch (b.type) {
        case "text":
          return { kind: "text", text: b.text, open: b.open, truncated: b.truncated === true };
        case "thinking":
          return { kind: "thinking", text: b.text, open: b.open, truncated: b.truncated === true };
        case "redacted_thinking":
          return { kind: "thinking", redacted: true, text: "", open: b.open };
        case "compaction":
          return { kind: "compaction", replaces: b.replaces.length, summary: b.summary };
        case "image":
        case "document":
        case "audio":
          return fileBlock(b, sessionId);
        case "tool_use": {
          const asked = b.perm_id ? permissions.get(b.perm_id) : undefined;
          const delegated = workers.get(b.id);
          return {
            kind: "tool",
            id: b.id,
            name: b.name,
            input: b.input,
            status: b.status,
            // In the item, so that a new progress redraws it (reconcile compares items).
            progress: b.status === "running" ? page.progress.get(b.id) || null : null,
            result: b.result,
            files: (b.files || []).map((f) => fileBlock(f, sessionId)),
            truncated: b.truncated === true,
            permissions: asked ? [{ ...asked, sessionId }] : [],
            worker: delegated
              ? {
                  sessionId: delegated.session_id,
                  task: delegated.task,
                  running: Boolean(delegated.running_turn_id),
                  items: fullItems(delegated.session_id, delegated.messages, permissions, workers, true),
                }
              : null,
          };
        }
        default:
          return { kind: "text", text: "", open: false };
      }
    }),
  }));
}

const TOOL_LINE = {
  preparing: (name) => `Preparing ${name}…`,
  awaiting_approval: (name) => `Waiting for your approval to run ${name}`,
  running: (name) => `Running ${name}…`,
};

/** The perm ids a full view's tool blocks ask (their own and their workers'). */
function askedInBlocks(messages, workers) {
  const asked = new Set();
  for (const message of messages) for (const b of message.blocks) if (b.perm_id) asked.add(b.perm_id);
  for (const worker of workers || []) for (const id of askedInBlocks(worker.messages)) asked.add(id);
  return asked;
}

/**
 * The status line and the permission requests not shown elsewhere, or null: in the simple
 * view every request and the status line; in the full view the requests no tool block of
 * the thread shows (a worker's, when its events are not streamed).
 */
function activityOf(view) {
  if (page.view !== "simple") {
    const shown = askedInBlocks(view.messages, view.workers);
    const permissions = view.permissions.filter((p) => !shown.has(p.perm_id));
    return permissions.length ? { line: "", permissions } : null;
  }
  const status = view.status;
  let line = "";
  if (status && status.kind === "thinking") line = status.text ? `Thinking: ${status.text}` : "Thinking…";
  else if (status && status.kind === "tool") line = (TOOL_LINE[status.state] || TOOL_LINE.running)(status.tool_name);
  else if (status && status.kind === "compacting") line = "Compacting the context…";
  const permissions = view.permissions.map((p) => ({ ...p, sessionId: page.sessionId }));
  if (!line && !permissions.length) return null;
  return { line, permissions };
}

/** The turn in flight: {turnId, inFlight} or null. */
function turnOf(reducer) {
  const turnId = reducer.runningTurnId;
  return turnId ? { turnId, inFlight: true } : null;
}
