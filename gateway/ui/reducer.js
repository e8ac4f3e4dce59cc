// The client state model and the two views of docs/protocol.md §10, for the browser and node.
//
// API (plain ES module: no dependency, no build step; node >= 18 and any current browser):
//
//   import { Reducer, fullView, simpleView } from "./reducer.js";
//
//   const reducer = new Reducer(sessionId);
//   reducer.apply(JSON.parse(text));   // every server frame, in order; only "snapshot" and
//                                      // "event" frames change the state; throws ReducerError
//                                      // on a move the contract does not allow (a server bug)
//   reducer.lastEventId                // the cursor: resubscribe with {"since": reducer.lastEventId}
//   reducer.runningTurnId              // the turn in flight (to cancel it), or null
//   fullView(reducer)                  // every message and block, tools paired with results
//   fullView(reducer, { workers: true })   // ... and the worker sessions (include_worker_sessions)
//   simpleView(reducer)                // replace-then-append: thread, status line, permissions
//   reducer.hasMore                    // the snapshot left older messages out (docs/protocol.md
//                                      // §15): page them with GET .../messages?before=
//                                      // reducer.oldestMessageId, then
//   reducer.prependHistory(page.messages, page.has_more)
//   reducer.replaceMessage(message)    // a finished message fetched whole (GET .../messages/ID)
//                                      // in place of the one a snapshot sent cut
//   (history.rewound: the messages from before_message_id on leave the state and both views,
//   docs/protocol.md §2 "Edit and regenerate"; one the reducer does not hold takes them all,
//   and oldestMessageId becomes it: GET .../messages?before= takes a rewound message's id)
//
// The views are pure functions of the reduced state, never of timing: a client that attached
// with a snapshot, or resumed with `since`, shows what one that saw every event live shows.
// They return plain JSON values, exactly the shapes gateway/client/views.py returns (one set
// of expected views in tests/streaming-conformance/ checks both):
//
//   fullView  = {session_id, running_turn_id, messages: [MessageView], permissions: [Permission],
//                workers?: [{session_id, tool_use_id, task, running_turn_id, messages}],
//                queued?: [Queued]}
//   MessageView = {id, role: "user"|"assistant"|"context", turn_id, status, blocks: [BlockView],
//                  steered?: true}
//     status: "complete" | "in_progress" | "cancelled" | "error"
//     steered: a user message the running turn took (turn.steered), in place in its turn
//   Queued = {turn_id, message_id, position, text}   (docs/protocol.md §2 "A busy session")
//     the turns waiting to start, next first (position 1 starts next), after the conversation;
//     `queued` is left out of both views when none waits
//   BlockView = {type: "text", text, open} | {type: "thinking", text, open}
//             | {type: "redacted_thinking", open}
//             | {type: "tool_use", id, name, input, open, status, result, perm_id}
//             | {type: "compaction", summary, replaces: [message id], open: false}
//             | {type: "image"|"document"|"audio", file_id, media_type, size, open: false}
//     (a file, by reference: its bytes are at GET /sessions/{id}/files/{file_id},
//     docs/protocol.md §2 "Files"; a tool_use view has "files": [...] when its outcome
//     brought some, tool.completed `files`)
//     (a context message's, docs/protocol.md §12; "truncated": true while its summary is
//     still to fetch, as after context.compacted, which does not carry it)
//     and "truncated": true on a text, thinking or tool block a snapshot sent cut (section 15)
//     tool status: "streaming" (block open) | "pending" (block ended, message still streaming)
//       | "awaiting_approval" (perm_id set) | "running" | "completed" | "failed" (result set)
//       | "not_run" (its message was cancelled or failed, or its turn ended without an outcome)
//   Permission = {perm_id, session_id, kind: "tool"|"elicitation", tool_use_id, tool_name, input,
//                 expires_at, message, requested_schema}   (pending requests only, the session's
//                 own and its workers'; message and requested_schema null but for an elicitation)
//
//   simpleView = {thread: [Entry], status: StatusLine | null, permissions: [Permission],
//                 queued?: [Queued]}
//   Entry = {role: "user"|"assistant", turn_id, message_id, text, status, steered?: true,
//            files?: [file view]}   (a user message's files, left out when none)
//         | {role: "context", turn_id, message_id, text: "", status: "complete", replaces: n}
//     (a compaction: one quiet line, never assistant text)
//     one user entry per user message; one assistant entry per turn: the text of the turn's
//     latest round (appended while it streams, replaced when a later round starts); status
//     "in_progress" while the turn runs, then "complete", "cancelled" or "error"; a steered
//     user message (steered: true) stands in its turn, and the turn's next round's reply
//     below it
//   StatusLine = {kind: "thinking", text}          (the latest thinking chunk, replaced each time)
//              | {kind: "tool", state: "preparing"|"awaiting_approval"|"running",
//                 tool_use_id, tool_name}
//              | {kind: "compacting", trigger}  (context.compacting without its context.compacted)
//
// The decisions where the contract is silent are the Python reference's, stated in the
// docstrings of gateway/client/reducer.py and gateway/client/views.py and in
// docs/protocol.md ("Views"). Both implementations must agree with
// tests/streaming-conformance/ (node --test tests/streaming-conformance/).

/** A move the contract does not allow (it can only be a server bug). */
export class ReducerError extends Error {
  constructor(message) {
    super(message);
    this.name = "ReducerError";
  }
}

// The block lifecycle, docs/protocol.md §5: which kinds of open block each delta or end addresses.
const BLOCK_KINDS = {
  "text.delta": ["text"],
  "text.end": ["text"],
  "thinking.delta": ["thinking", "redacted_thinking"],
  "thinking.end": ["thinking", "redacted_thinking"],
  "tool.use_input_delta": ["tool_use"],
  "tool.use_end": ["tool_use"],
};

const STATUS_BY_STOP_REASON = { cancelled: "cancelled", error: "error" };

class StreamingBlock {
  constructor(kind, fields = {}) {
    this.kind = kind;
    this.text = "";
    this.lastChunk = "";
    this.signature = null;
    this.toolUseId = "";
    this.toolName = "";
    this.partialJson = ""; // null for a restored tool block: its raw text is unknown
    this.snapshotInput = {};
    this.finalInput = null;
    this.closed = false;
    this.restored = false;
    this.truncated = false; // restored from a block a snapshot cut (docs/protocol.md §15)
    Object.assign(this, fields);
  }

  static restore(block) {
    const truncated = block.truncated === true;
    switch (block.type) {
      case "text":
        return new StreamingBlock("text", { text: block.text, restored: true, truncated });
      case "thinking":
        return new StreamingBlock("thinking", {
          text: block.thinking,
          signature: block.signature ?? null,
          restored: true,
          truncated,
        });
      case "redacted_thinking":
        return new StreamingBlock("redacted_thinking", { text: block.data, restored: true, truncated });
      case "tool_use":
        return new StreamingBlock("tool_use", {
          toolUseId: block.id,
          toolName: block.name,
          partialJson: null,
          snapshotInput: block.input ?? {},
          restored: true,
          truncated,
        });
      default:
        throw new ReducerError(`a streaming assistant message cannot hold a ${block.type} block`);
    }
  }

  /** A tool block's input: final once ended, else the best parse so far. */
  get input() {
    if (this.finalInput !== null) return this.finalInput;
    if (this.partialJson === null) return this.snapshotInput;
    return bestEffort(this.partialJson);
  }

  asContentBlock() {
    switch (this.kind) {
      case "text":
        return { type: "text", text: this.text };
      case "thinking":
        return { type: "thinking", thinking: this.text, signature: this.signature };
      case "redacted_thinking":
        return { type: "redacted_thinking", data: this.text };
      default:
        return { type: "tool_use", id: this.toolUseId, name: this.toolName, input: this.input };
    }
  }
}

class StreamingMessage {
  constructor(messageId, model, turnId) {
    this.messageId = messageId;
    this.model = model ?? null;
    this.turnId = turnId ?? null;
    this.blocks = new Map(); // content_block_index -> StreamingBlock
  }

  static restore(message) {
    const streaming = new StreamingMessage(message.id, message.model, message.turn_id);
    message.content.forEach((block, index) => streaming.start(index, StreamingBlock.restore(block)));
    if ("open_block_index" in message) {
      // docs/protocol.md §6: the block still streaming; every other one has ended.
      for (const [index, block] of streaming.blocks) block.closed = index !== message.open_block_index;
    }
    return streaming;
  }

  start(index, block) {
    if (this.blocks.has(index)) {
      throw new ReducerError(`block ${index} of message ${this.messageId} started twice`);
    }
    for (const [earlier, restored] of this.blocks) {
      if (earlier < index && restored.restored) restored.closed = true;
    }
    this.blocks.set(index, block);
  }

  sortedBlocks() {
    return [...this.blocks.entries()].sort((a, b) => a[0] - b[0]);
  }

  /** The block still streaming, if one is: the last one not closed. */
  openBlock() {
    const sorted = this.sortedBlocks();
    for (let i = sorted.length - 1; i >= 0; i--) if (!sorted[i][1].closed) return sorted[i][1];
    return null;
  }

  addressedBlock(eventType, index) {
    const block = this.blocks.get(index);
    const where = `${eventType} for block ${index} of message ${this.messageId}`;
    if (block === undefined) throw new ReducerError(`${where}: the block was never started`);
    if (block.closed) throw new ReducerError(`${where}: the block has already ended`);
    if (!BLOCK_KINDS[eventType].includes(block.kind)) {
      throw new ReducerError(`${where}: the block is a ${block.kind} block`);
    }
    return block;
  }
}

/** The outcome a stored tool_result block stands for (a snapshot, a page of history). */
function outcomeOfBlock(block) {
  return {
    tool_use_id: block.tool_use_id,
    status: block.is_error ? "failed" : "completed",
    content: block.content,
    error_class: null,
    files: block.files ?? [],
  };
}

/** A file block as the views show it: a reference, never the bytes (docs/protocol.md §2 "Files"). */
export function fileView(block) {
  return { type: block.type, file_id: block.file_id, media_type: block.media_type, size: block.size, open: false };
}

const FILE_TYPES = new Set(["image", "document", "audio"]);

/** The file blocks of a message (or of a message view's blocks), as views. */
export function filesOf(blocks) {
  return blocks.filter((b) => FILE_TYPES.has(b.type)).map(fileView);
}

/** One file as a line of text: "[image image/png 12.3 KiB file_…]". */
export function fileLine(file) {
  return `[${file.type} ${file.media_type} ${humanSize(file.size)} ${file.file_id}]`;
}

/** "512 B", "12.3 KiB", "4.0 MiB". */
export function humanSize(size) {
  if (size < 1024) return `${size} B`;
  const [unit, name] = size < 1024 * 1024 ? [1024, "KiB"] : [1024 * 1024, "MiB"];
  const tenths = Math.floor((size * 10 + unit / 2) / unit); // in integers, as in views.py
  return `${Math.floor(tenths / 10)}.${tenths % 10} ${name}`;
}

function toolResultsOnly(message) {
  return (
    message.role === "user" &&
    message.content.length > 0 &&
    message.content.every((b) => b.type === "tool_result")
  );
}

/** One session's state, built from every server frame of its stream (gateway/client/reducer.py). */
export class Reducer {
  /**
   * @param {string} sessionId the session whose stream this is; events of other (worker)
   *   sessions go to a reducer of their own in `workers`.
   * @param {{lenient?: boolean}} options lenient: skip (and count in `skipped`) a move the
   *   contract does not allow instead of throwing, for a stream joined at an unknown point.
   */
  constructor(sessionId, { lenient = false } = {}) {
    this.sessionId = sessionId;
    this.lenient = lenient;
    this.messages = [];
    this.streaming = null;
    this.toolResults = new Map(); // tool_use_id -> {tool_use_id, status, content, error_class}
    this.turn = null; // {turn_id, status: "in_flight"|"completed"|"cancelled", stop_reason}
    this.turnOutcomes = new Map(); // turn_id -> turn, as this client saw it end
    // Turns waiting to start, next first: turn_id -> its user message (docs/protocol.md §2
    // "A busy session"); they leave with their turn.started or turn.cancelled (phase queued).
    this.queued = new Map();
    this.permissions = new Map(); // perm_id -> {perm_id, tool_use_id, tool_name, input, expires_at}
    this.workers = new Map(); // worker session id -> Reducer
    this.links = new Map(); // worker session id -> {tool_use_id, task, parent_session_id}
    this.lastEventId = null;
    this.duplicatesIgnored = 0;
    this.skipped = 0;
    // docs/protocol.md §15: the last snapshot left older messages out, and the
    // tool results it sent cut (gateway/client/reducer.py, "Cut blocks").
    this.hasMore = false;
    this.truncatedResults = new Set();
    this.oldestMessageId = null; // the first message the snapshot (or a page before it) sent
    this.compacting = null; // the compaction under way: {trigger, pre_tokens} (docs/protocol.md §12)
  }

  /** The id of the turn in flight, or null when the session is idle. */
  get runningTurnId() {
    return this.turn !== null && this.turn.status === "in_flight" ? this.turn.turn_id : null;
  }

  /** Apply one server frame (a parsed JSON object); returns the reducer. */
  apply(frame) {
    if (frame.type === "snapshot") this.applySnapshot(frame);
    else if (frame.type === "event") this.applyEvent(frame.event);
    return this;
  }

  /** Apply one event (docs/protocol.md sections 4-8); unknown types only move the cursor. */
  applyEvent(event) {
    if (this.lastEventId !== null && event.id <= this.lastEventId) {
      this.duplicatesIgnored += 1;
      return this;
    }
    if (event.session_id === this.sessionId) {
      this.dispatch(event);
    } else {
      let worker = this.workers.get(event.session_id);
      if (worker === undefined) {
        worker = new Reducer(event.session_id, { lenient: true });
        this.workers.set(event.session_id, worker);
      }
      worker.dispatch(event);
      // A worker's request is the parent's to answer (docs/protocol.md §5).
      if (event.type === "permission.requested" || event.type === "permission.resolved") this.permission(event);
    }
    if (event.type === "delegate.started") {
      const p = event.payload;
      this.links.set(p.worker_session_id, {
        tool_use_id: p.tool_use_id,
        task: p.task,
        parent_session_id: event.session_id,
      });
    }
    this.lastEventId = event.id;
    return this;
  }

  /** A `snapshot` frame replaces everything (docs/protocol.md sections 3 and 6). */
  applySnapshot(snapshot) {
    const session = snapshot.session;
    if (session.id !== this.sessionId) {
      throw new ReducerError(`snapshot of session ${session.id} in the stream of ${this.sessionId}`);
    }
    const messages = [...snapshot.messages];
    const inProgress = messages.length > 0 && messages[messages.length - 1].status === "in_progress";
    this.streaming = inProgress ? StreamingMessage.restore(messages.pop()) : null;
    this.messages = messages.filter((m) => !toolResultsOnly(m));
    this.toolResults = new Map();
    this.truncatedResults = new Set();
    this.hasMore = snapshot.has_more === true;
    this.oldestMessageId = messages.length > 0 ? messages[0].id : this.streaming ? this.streaming.messageId : null;
    for (const message of messages) {
      if (message.role !== "user") continue;
      for (const block of message.content) {
        if (block.type !== "tool_result") continue;
        if (block.truncated === true) this.truncatedResults.add(block.tool_use_id);
        this.toolResults.set(block.tool_use_id, outcomeOfBlock(block));
      }
    }
    const turnId = session.current_turn_id ?? null;
    const inFlight = turnId !== null && session.current_turn_status === "in_flight";
    this.turn = inFlight ? { turn_id: turnId, status: "in_flight", stop_reason: null } : null;
    this.turnOutcomes = new Map();
    this.queued = new Map((session.queued_turns ?? []).map((q) => [q.turn_id, q.user_message]));
    this.permissions = new Map((session.pending_permissions ?? []).map((p) => [p.perm_id, { ...p }]));
    this.compacting = null; // a snapshot cannot say one is under way
    this.workers = new Map();
    this.links = new Map();
    this.lastEventId = snapshot.snapshot_at_event_id ?? null;
    return this;
  }

  /** Older finished messages (a page of GET .../messages, oldest first) before the first one. */
  prependHistory(messages, hasMore) {
    const known = new Set(this.messages.map((m) => m.id));
    const older = messages.filter((m) => !known.has(m.id));
    for (const message of older) {
      if (message.role !== "user") continue;
      for (const block of message.content) {
        if (block.type !== "tool_result" || this.toolResults.has(block.tool_use_id)) continue;
        this.toolResults.set(block.tool_use_id, outcomeOfBlock(block));
      }
    }
    this.messages = [...older.filter((m) => !toolResultsOnly(m)), ...this.messages];
    if (older.length > 0) this.oldestMessageId = older[0].id;
    this.hasMore = hasMore === true;
    return this;
  }

  /** A finished message fetched whole, in place of the one a snapshot sent cut (section 15). */
  replaceMessage(message) {
    const position = this.messages.findIndex((m) => m.id === message.id);
    if (position >= 0) this.messages[position] = message;
    for (const block of message.content) {
      if (block.type !== "tool_result" || !this.truncatedResults.has(block.tool_use_id)) continue;
      this.truncatedResults.delete(block.tool_use_id);
      const outcome = this.toolResults.get(block.tool_use_id);
      if (outcome !== undefined) {
        this.toolResults.set(block.tool_use_id, { ...outcome, content: block.content, files: block.files ?? [] });
      }
    }
    return this;
  }

  dispatch(event) {
    if (!this.lenient) {
      this.move(event);
      return;
    }
    try {
      this.move(event);
    } catch (error) {
      if (!(error instanceof ReducerError)) throw error;
      this.skipped += 1; // a failed move changes nothing
    }
  }

  move(event) {
    const p = event.payload;
    switch (event.type) {
      case "turn.started":
        if (this.runningTurnId !== null) {
          throw new ReducerError(`turn.started for ${p.turn_id} while ${this.turn.turn_id} is in flight`);
        }
        this.queued.delete(p.turn_id);
        this.put(p.user_message);
        this.turn = { turn_id: p.turn_id, status: "in_flight", stop_reason: null };
        break;
      case "turn.completed":
        this.endTurn({ turn_id: p.turn_id, status: "completed", stop_reason: p.stop_reason });
        break;
      case "turn.cancelled":
        if (p.phase === "queued") {
          // never started: it leaves the queue, and no turn in flight ends
          this.queued.delete(p.turn_id);
          this.turnOutcomes.set(p.turn_id, { turn_id: p.turn_id, status: "cancelled", stop_reason: null });
          break;
        }
        this.endTurn({ turn_id: p.turn_id, status: "cancelled", stop_reason: null });
        break;
      case "turn.queued":
        this.queued.set(p.turn_id, p.user_message);
        break;
      case "turn.steered": // the running turn took it: a message of the turn, where it is stored
        this.put(p.user_message);
        break;
      case "tool.completed":
        this.toolOutcome({
          tool_use_id: p.tool_use_id,
          status: "completed",
          content: p.result,
          error_class: null,
          files: p.files ?? [],
        });
        break;
      case "tool.failed":
        this.toolOutcome({
          tool_use_id: p.tool_use_id,
          status: "failed",
          content: p.message,
          error_class: p.error_class,
        });
        break;
      case "permission.requested":
      case "permission.resolved":
        this.permission(event);
        break;
      case "context.compacting":
        this.compacting = { trigger: p.trigger, pre_tokens: p.pre_tokens };
        break;
      case "session.forked":
        break; // a fork's first event: its copied history is in its snapshot (protocol.md §10)
      case "context.compacted":
        this.compacted(event, p);
        break;
      case "history.rewound":
        this.rewound(p);
        break;
      case "message.start":
        if (this.streaming !== null) {
          throw new ReducerError(
            `message.start for ${p.message_id} while ${this.streaming.messageId} is still streaming`,
          );
        }
        this.streaming = new StreamingMessage(p.message_id, p.model, event.turn_id);
        break;
      case "message.snapshot":
        this.streaming = StreamingMessage.restore(p.message);
        break;
      case "message.complete":
        this.messageComplete(event, p);
        break;
      case "text.start":
        this.streamingFor(event.type, p.message_id).start(p.content_block_index, new StreamingBlock("text"));
        break;
      case "thinking.start":
        this.streamingFor(event.type, p.message_id).start(
          p.content_block_index,
          new StreamingBlock(p.redacted ? "redacted_thinking" : "thinking"),
        );
        break;
      case "tool.use_start":
        this.streamingFor(event.type, p.message_id).start(
          p.content_block_index,
          new StreamingBlock("tool_use", { toolUseId: p.tool_use_id, toolName: p.tool_name }),
        );
        break;
      case "text.delta":
      case "thinking.delta": {
        const block = this.openBlock(event.type, p);
        block.text += p.text;
        if (p.text) block.lastChunk = p.text;
        if (event.type === "thinking.delta" && p.signature != null) block.signature = p.signature;
        break;
      }
      case "tool.use_input_delta": {
        const block = this.openBlock(event.type, p);
        if (block.partialJson !== null) block.partialJson += p.partial_json;
        break;
      }
      case "text.end":
        this.openBlock(event.type, p).closed = true;
        break;
      case "thinking.end": {
        const block = this.openBlock(event.type, p);
        if (p.signature != null) block.signature = p.signature;
        block.closed = true;
        break;
      }
      case "tool.use_end": {
        const block = this.openBlock(event.type, p);
        if (!block.toolName && p.tool_name) block.toolName = p.tool_name; // docs/protocol.md §5
        block.finalInput = p.final_input;
        block.closed = true;
        break;
      }
      default:
        break; // an unknown type (docs/protocol.md §4), or one that does not change this state
    }
  }

  /** A request added or resolved, the session's own or a worker's (its session_id). */
  permission(event) {
    const p = event.payload;
    if (event.type === "permission.resolved") {
      this.permissions.delete(p.perm_id);
      return;
    }
    const pending = {
      perm_id: p.perm_id,
      session_id: event.session_id,
      kind: p.kind ?? "tool",
      tool_use_id: p.tool_use_id,
      tool_name: p.tool_name,
      input: p.input,
      expires_at: p.expires_at,
    };
    if (p.message !== undefined) pending.message = p.message;
    if (p.requested_schema !== undefined) pending.requested_schema = p.requested_schema;
    this.permissions.set(p.perm_id, pending);
  }

  /** The compaction's context message, its summary still to fetch (gateway/client/reducer.py). */
  compacted(event, p) {
    this.compacting = null;
    if (p.summary_message_id == null) return;
    const replaces = [];
    for (const message of this.messages) {
      if (message.id === p.first_kept_message_id) break;
      if (message.role !== "context") replaces.push(message.id);
    }
    this.put({
      id: p.summary_message_id,
      session_id: event.session_id,
      turn_id: event.turn_id ?? null,
      role: "context",
      content: [{ type: "compaction", summary: "", replaces, truncated: true }],
      status: "complete",
      created_at: event.ts,
    });
  }

  /** The messages from before_message_id on leave, and their tools' results (docs/protocol.md
   * §2 "Edit and regenerate"; gateway/client/reducer.py, "Rewinds"). */
  rewound(p) {
    let at = this.messages.findIndex((m) => m.id === p.before_message_id);
    if (at < 0) {
      // older than every message held: all of them go, and paging goes on from it
      at = 0;
      if (this.hasMore) this.oldestMessageId = p.before_message_id;
    }
    for (const message of this.messages.splice(at)) {
      for (const block of message.content) {
        if (block.type !== "tool_use") continue;
        this.toolResults.delete(block.id);
        this.truncatedResults.delete(block.id);
      }
    }
  }

  endTurn(ended) {
    // A client that resumed mid-turn never saw it start; only another turn's end is wrong.
    const current = this.turn;
    if (current !== null && current.status === "in_flight" && current.turn_id !== ended.turn_id) {
      throw new ReducerError(`turn ${ended.turn_id} ${ended.status} while ${current.turn_id} is in flight`);
    }
    this.turn = ended;
    this.turnOutcomes.set(ended.turn_id, ended);
    this.permissions.clear(); // a turn's requests end with it
    this.compacting = null; // and so does a compaction it began
  }

  toolOutcome(outcome) {
    this.toolResults.set(outcome.tool_use_id, outcome);
    for (const [permId, pending] of this.permissions) {
      if (pending.tool_use_id === outcome.tool_use_id) this.permissions.delete(permId);
    }
  }

  messageComplete(event, p) {
    const streaming = this.streaming;
    if (streaming !== null && streaming.messageId !== p.message_id) {
      throw new ReducerError(`message.complete for ${p.message_id} while ${streaming.messageId} is streaming`);
    }
    this.put({
      id: p.message_id,
      session_id: event.session_id,
      turn_id: event.turn_id,
      role: "assistant",
      content: p.final_content,
      status: STATUS_BY_STOP_REASON[p.stop_reason] ?? "complete",
      created_at: event.ts,
      model: streaming === null ? null : streaming.model,
      usage: p.usage,
    });
    this.streaming = null;
  }

  streamingFor(eventType, messageId) {
    if (this.streaming === null) {
      throw new ReducerError(`${eventType} for message ${messageId}, but none is streaming`);
    }
    if (this.streaming.messageId !== messageId) {
      throw new ReducerError(
        `${eventType} for message ${messageId}, but ${this.streaming.messageId} is streaming`,
      );
    }
    return this.streaming;
  }

  openBlock(eventType, p) {
    const block = this.streamingFor(eventType, p.message_id).addressedBlock(eventType, p.content_block_index);
    if ((eventType === "tool.use_input_delta" || eventType === "tool.use_end") && p.tool_use_id !== block.toolUseId) {
      throw new ReducerError(
        `${eventType} for tool use ${p.tool_use_id}, but block ${p.content_block_index} is tool use ${block.toolUseId}`,
      );
    }
    return block;
  }

  put(message) {
    const at = this.messages.findIndex((m) => m.id === message.id);
    if (at >= 0) this.messages[at] = message;
    else this.messages.push(message);
  }
}

// --- the full view ------------------------------------------------------------------------

/** Every message with every block, tools paired with their results (section 10 "full"). */
export function fullView(reducer, { workers = false } = {}) {
  const view = {
    session_id: reducer.sessionId,
    running_turn_id: reducer.runningTurnId,
    messages: messageViews(reducer),
    permissions: permissionViews(reducer),
  };
  if (workers) {
    view.workers = [...reducer.workers.values()].map((worker) => {
      const link = reducer.links.get(worker.sessionId);
      return {
        session_id: worker.sessionId,
        tool_use_id: link === undefined ? null : link.tool_use_id,
        task: link === undefined ? null : link.task,
        running_turn_id: worker.runningTurnId,
        messages: messageViews(worker),
      };
    });
  }
  const queued = queuedView(reducer);
  if (queued.length > 0) view.queued = queued;
  return view;
}

/** The turns waiting to start, next first (docs/protocol.md §2 "A busy session", §10). */
export function queuedView(reducer) {
  return [...reducer.queued.entries()].map(([turnId, message], i) => ({
    turn_id: turnId,
    message_id: message.id,
    position: i + 1,
    text: textOf(message),
  }));
}

/** A user message's text blocks, joined with newlines. */
function textOf(message) {
  return message.content
    .filter((b) => b.type === "text")
    .map((b) => b.text)
    .join("\n");
}

/** A user message of a turn that already has one before it: a steer it took. */
function isSteered(message, turnsAsked) {
  if (message.role !== "user") return false;
  const turnId = message.turn_id ?? null;
  const steered = turnId !== null && turnsAsked.has(turnId);
  turnsAsked.add(turnId);
  return steered;
}

function messageViews(reducer) {
  const turnsAsked = new Set();
  const views = reducer.messages.map((message) => {
    const view = {
      id: message.id,
      role: message.role,
      turn_id: message.turn_id ?? null,
      status: message.status,
      blocks: message.content.map((block) => finishedBlock(reducer, message, block)).filter((b) => b !== null),
    };
    if (isSteered(message, turnsAsked)) view.steered = true;
    return view;
  });
  const streaming = reducer.streaming;
  if (streaming !== null) {
    views.push({
      id: streaming.messageId,
      role: "assistant",
      turn_id: streaming.turnId,
      status: "in_progress",
      blocks: streaming.sortedBlocks().map(([, block]) => streamingBlock(reducer, block)),
    });
  }
  return views;
}

function finishedBlock(reducer, message, block) {
  switch (block.type) {
    case "text":
      return cut({ type: "text", text: block.text, open: false }, block.truncated === true);
    case "thinking":
      return cut({ type: "thinking", text: block.thinking, open: false }, block.truncated === true);
    case "redacted_thinking":
      return { type: "redacted_thinking", open: false };
    case "tool_use": {
      const running =
        message.status === "complete" && message.turn_id != null && message.turn_id === reducer.runningTurnId;
      const view = toolView(reducer, block.id, block.name, block.input, false, running ? "running" : "not_run");
      return cut(view, block.truncated === true);
    }
    case "compaction":
      return cut(
        { type: "compaction", summary: block.summary, replaces: [...block.replaces], open: false },
        block.truncated === true,
      );
    case "image":
    case "document":
    case "audio":
      return fileView(block);
    default:
      return null; // a tool_result: paired with its tool_use instead
  }
}

function streamingBlock(reducer, block) {
  const open = !block.closed;
  switch (block.kind) {
    case "text":
      return cut({ type: "text", text: block.text, open }, block.truncated);
    case "thinking":
      return cut({ type: "thinking", text: block.text, open }, block.truncated);
    case "redacted_thinking":
      return { type: "redacted_thinking", open };
    default: {
      const view = toolView(reducer, block.toolUseId, block.toolName, block.input, open, open ? "streaming" : "pending");
      return cut(view, block.truncated && block.finalInput === null);
    }
  }
}

/** The view, with `truncated: true` when what it shows was sent cut (docs/protocol.md §15). */
function cut(view, truncated) {
  if (truncated) view.truncated = true;
  return view;
}

function toolView(reducer, toolUseId, name, input, open, otherwise) {
  const outcome = reducer.toolResults.get(toolUseId);
  const permission = permissionFor(reducer, toolUseId);
  let status = otherwise;
  let result = null;
  if (outcome !== undefined) {
    status = outcome.status;
    result = outcome.content;
  } else if (permission !== null && !open) {
    status = "awaiting_approval";
  }
  const view = {
    type: "tool_use",
    id: toolUseId,
    name,
    input,
    open,
    status,
    result,
    perm_id: permission === null || outcome !== undefined ? null : permission.perm_id,
  };
  if (outcome !== undefined && outcome.files?.length > 0) view.files = outcome.files.map(fileView);
  return cut(view, outcome !== undefined && reducer.truncatedResults.has(toolUseId));
}

function permissionFor(reducer, toolUseId) {
  for (const pending of reducer.permissions.values()) if (pending.tool_use_id === toolUseId) return pending;
  return null;
}

function permissionViews(reducer) {
  return [...reducer.permissions.values()].map((p) => ({
    perm_id: p.perm_id,
    session_id: p.session_id,
    kind: p.kind ?? "tool",
    tool_use_id: p.tool_use_id,
    tool_name: p.tool_name,
    input: p.input,
    expires_at: p.expires_at,
    message: p.message ?? null,
    requested_schema: p.requested_schema ?? null,
  }));
}

// --- the replace-then-append view -----------------------------------------------------------

/** The replace-then-append view (section 10, seed 004), for end users. */
export function simpleView(reducer) {
  const thread = [];
  const latest = new Map(); // turn_id -> [position, message (finished) or StreamingMessage]
  const turnsAsked = new Set();
  const moving = new Set(); // turns whose next round's reply goes below a steer
  for (const message of reducer.messages) {
    if (message.role === "user") {
      const entry = {
        role: "user",
        turn_id: message.turn_id ?? null,
        message_id: message.id,
        text: textOf(message),
        status: "complete",
      };
      if (isSteered(message, turnsAsked)) {
        entry.steered = true;
        if (latest.has(entry.turn_id)) moving.add(entry.turn_id); // it answered a round
      }
      const files = filesOf(message.content);
      if (files.length > 0) entry.files = files;
      thread.push(entry);
    } else if (message.role === "context") {
      // A compaction: one quiet line, never assistant text (docs/protocol.md §12).
      thread.push({
        role: "context",
        turn_id: message.turn_id ?? null,
        message_id: message.id,
        text: "",
        status: "complete",
        replaces: message.content
          .filter((b) => b.type === "compaction")
          .reduce((n, b) => n + b.replaces.length, 0),
      });
    } else {
      reply(thread, latest, message.turn_id ?? null, message, moving);
    }
  }
  if (reducer.streaming !== null) reply(thread, latest, reducer.streaming.turnId, reducer.streaming, moving);
  for (const [turnId, [position, last]] of latest) thread[position].status = replyStatus(reducer, turnId, last);
  const view = { thread, status: statusLine(reducer), permissions: permissionViews(reducer) };
  const queued = queuedView(reducer);
  if (queued.length > 0) view.queued = queued;
  return view;
}

function reply(thread, latest, turnId, message, moving) {
  let messageId;
  let text;
  if (message instanceof StreamingMessage) {
    messageId = message.messageId;
    text = message
      .sortedBlocks()
      .filter(([, b]) => b.kind === "text")
      .map(([, b]) => b.text)
      .join("");
  } else {
    messageId = message.id;
    text = message.content
      .filter((b) => b.type === "text")
      .map((b) => b.text)
      .join("");
  }
  const entry = { role: "assistant", turn_id: turnId, message_id: messageId, text, status: "in_progress" };
  if (moving.has(turnId)) {
    // the earlier round's reply leaves its place: this round's goes below the steer
    moving.delete(turnId);
    const gone = latest.get(turnId)[0];
    latest.delete(turnId);
    thread.splice(gone, 1);
    for (const [other, [at, last]] of latest) if (at > gone) latest.set(other, [at - 1, last]);
  }
  let position;
  if (latest.has(turnId)) {
    position = latest.get(turnId)[0];
    thread[position] = entry;
  } else {
    position = thread.length;
    thread.push(entry);
  }
  latest.set(turnId, [position, message]);
}

function replyStatus(reducer, turnId, message) {
  if (turnId !== null && turnId === reducer.runningTurnId) return "in_progress";
  if (message instanceof StreamingMessage) return "in_progress";
  const known = turnId === null ? undefined : reducer.turnOutcomes.get(turnId);
  if (known !== undefined) {
    if (known.status === "cancelled") return "cancelled";
    return known.stop_reason === "error" ? "error" : "complete";
  }
  if (message.status === "cancelled" || message.status === "error") return message.status;
  const outcomes = message.content
    .filter((b) => b.type === "tool_use" && reducer.toolResults.has(b.id))
    .map((b) => reducer.toolResults.get(b.id));
  if (outcomes.some((o) => o.status === "failed" && o.content === "cancelled")) return "cancelled";
  return outcomes.length > 0 ? "error" : "complete";
}

function statusLine(reducer) {
  if (reducer.compacting !== null) return { kind: "compacting", trigger: reducer.compacting.trigger };
  const running = reducer.runningTurnId;
  if (running === null) return null;
  const streaming = reducer.streaming;
  if (streaming !== null && streaming.turnId === running) {
    const block = streaming.openBlock();
    if (block === null) return null;
    switch (block.kind) {
      case "thinking":
        return { kind: "thinking", text: block.lastChunk };
      case "redacted_thinking":
        return { kind: "thinking", text: "" };
      case "tool_use":
        return { kind: "tool", state: "preparing", tool_use_id: block.toolUseId, tool_name: block.toolName };
      default:
        return null;
    }
  }
  const waiting = [];
  for (const message of reducer.messages) {
    if (message.role !== "assistant" || message.turn_id !== running || message.status !== "complete") continue;
    for (const b of message.content) {
      if (b.type !== "tool_use" || reducer.toolResults.has(b.id)) continue;
      const state = permissionFor(reducer, b.id) !== null ? "awaiting_approval" : "running";
      waiting.push({ kind: "tool", state, tool_use_id: b.id, tool_name: b.name });
    }
  }
  return waiting.find((line) => line.state === "awaiting_approval") ?? waiting[0] ?? null;
}

// --- best-effort parsing of a cut JSON object (gateway/partial_json.py) --------------------

const WS = "[ \\t\\n\\r]*";
const STRING_BODY = '"(?:[^"\\\\\\u0000-\\u001f]|\\\\(?:["\\\\/bfnrt]|u[0-9a-fA-F]{4}))*';
const TOKEN = new RegExp(
  `${WS}(?:(?<string>${STRING_BODY}")|(?<punct>[{}\\[\\],:])|(?<scalar>true|false|null|-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?(?=[ \\t\\n\\r,\\]}])))`,
  "y",
);
const CUT_STRING = new RegExp(`${WS}(${STRING_BODY})(?:\\\\(?:u[0-9a-fA-F]{0,3})?)?$`, "y");
const DANGLING_SURROGATE = /\\u[dD][89abAB][0-9a-fA-F]{2}$/;

const VALUE = "value";
const ITEM_OR_CLOSE = "value or ]";
const KEY = "key";
const KEY_OR_CLOSE = "key or }";
const COLON = "colon";
const AFTER_MEMBER = ", or }";
const AFTER_ITEM = ", or ]";
const AFTER_VALUE = "after a value";
const VALUE_MOVES = { "{": KEY_OR_CLOSE, "[": ITEM_OR_CLOSE, string: AFTER_VALUE, scalar: AFTER_VALUE };
const MOVES = new Map();
for (const [token, then] of Object.entries(VALUE_MOVES)) {
  MOVES.set(`${VALUE}|${token}`, then);
  MOVES.set(`${ITEM_OR_CLOSE}|${token}`, then);
}
for (const [expect, token, then] of [
  [ITEM_OR_CLOSE, "]", AFTER_VALUE],
  [KEY_OR_CLOSE, "string", COLON],
  [KEY_OR_CLOSE, "}", AFTER_VALUE],
  [KEY, "string", COLON],
  [COLON, ":", VALUE],
  [AFTER_MEMBER, ",", KEY],
  [AFTER_MEMBER, "}", AFTER_VALUE],
  [AFTER_ITEM, ",", VALUE],
  [AFTER_ITEM, "]", AFTER_VALUE],
]) {
  MOVES.set(`${expect}|${token}`, then);
}
const SAFE = new Set([KEY_OR_CLOSE, ITEM_OR_CLOSE, AFTER_MEMBER, AFTER_ITEM]);
const CLOSERS = { "{": "}", "[": "]" };

/**
 * Parse a possibly truncated JSON object, as gateway/partial_json.py does: complete pairs
 * kept, a cut string value closed, a trailing key or number dropped, open containers closed;
 * `{}` when the text is not (the start of) an object. Never throws.
 */
export function bestEffort(text) {
  for (const candidate of candidates(text)) {
    let value;
    try {
      value = JSON.parse(candidate);
    } catch {
      continue;
    }
    if (hasLoneSurrogate(value)) continue; // JSON.parse takes them; the Python decoder does not
    return value !== null && typeof value === "object" && !Array.isArray(value) ? value : {};
  }
  return {};
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function hasLoneSurrogate(value) {
  if (typeof value === "string") return LONE_SURROGATE.test(value);
  if (value === null || typeof value !== "object") return false;
  const items = Array.isArray(value) ? value : [...Object.keys(value), ...Object.values(value)];
  return items.some(hasLoneSurrogate);
}

function* candidates(text) {
  yield text;
  const stack = [];
  let expect = VALUE;
  let safeEnd = -1;
  let safeClosers = "";
  let pos = 0;
  for (;;) {
    TOKEN.lastIndex = pos;
    const match = TOKEN.exec(text);
    if (match === null) break;
    const token = match.groups.punct ?? (match.groups.string !== undefined ? "string" : "scalar");
    if (stack.length === 0 && token !== "{") return;
    let then = MOVES.get(`${expect}|${token}`);
    if (then === undefined) break;
    if (token in CLOSERS) {
      stack.push(CLOSERS[token]);
    } else if (token === "}" || token === "]") {
      stack.pop();
      if (stack.length === 0) {
        yield text.slice(0, TOKEN.lastIndex);
        return;
      }
    }
    if (then === AFTER_VALUE) then = stack[stack.length - 1] === "}" ? AFTER_MEMBER : AFTER_ITEM;
    expect = then;
    pos = TOKEN.lastIndex;
    if (SAFE.has(expect)) {
      safeEnd = pos;
      safeClosers = [...stack].reverse().join("");
    }
  }
  if (safeEnd < 0) return;
  CUT_STRING.lastIndex = pos;
  const cut = CUT_STRING.exec(text);
  if (cut !== null && (expect === VALUE || expect === ITEM_OR_CLOSE)) {
    const body = cut[1].replace(DANGLING_SURROGATE, "");
    const bodyStart = cut.index + cut[0].indexOf(cut[1]);
    yield text.slice(0, bodyStart) + body + '"' + [...stack].reverse().join("");
  }
  yield text.slice(0, safeEnd) + safeClosers;
}
