// The JS reducer (gateway/ui/reducer.js) against the recorded traces: node --test tests/streaming-conformance/
//
// Each trace (traces/NAME.jsonl: the server frames one client received) is fed to the
// reducer frame by frame. After every frame the simple view must equal the last one the
// expected file recorded, and after every frame that is not a delta the full view too
// (traces/NAME.expected.json, written by record.py from the Python reference; see README.md).
// The same files drive tests/integration/client/test_conformance.py, so both languages agree frame by frame.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  Reducer,
  ReducerError,
  bestEffort,
  fileLine,
  fullView,
  humanSize,
  simpleView,
} from "../../gateway/ui/reducer.js";

const here = dirname(fileURLToPath(import.meta.url));
const traces = join(here, "traces");
const DELTAS = new Set(["text.delta", "thinking.delta", "tool.use_input_delta"]);

function load(name) {
  const frames = readFileSync(join(traces, `${name}.jsonl`), "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line));
  const expected = JSON.parse(readFileSync(join(traces, `${name}.expected.json`), "utf8"));
  return { frames, expected };
}

function sessionOf(frames) {
  for (const frame of frames) {
    if (frame.type === "snapshot") return frame.session.id;
    if (frame.type === "event") return frame.event.session_id;
  }
  throw new Error("a trace without a snapshot or an event");
}

const names = readdirSync(traces)
  .filter((file) => file.endsWith(".jsonl"))
  .map((file) => file.slice(0, -".jsonl".length))
  .sort();

test("a file as a line of text, as gateway/client/views.py file_line writes it", () => {
  // The same cases as tests/integration/client/test_client_files.py and test_chat_attach.py.
  assert.deepEqual(
    [0, 1023, 1024, 1280, 12595, 5 * 1024 * 1024, 1572864 + 52429].map(humanSize),
    ["0 B", "1023 B", "1.0 KiB", "1.3 KiB", "12.3 KiB", "5.0 MiB", "1.6 MiB"],
  );
  const id = `file_${"a".repeat(32)}`;
  const file = { type: "image", file_id: id, media_type: "image/png", size: 12595, open: false };
  assert.equal(fileLine(file), `[image image/png 12.3 KiB ${id}]`);
});

test("there are traces", () => {
  assert.ok(names.length >= 14, `only ${names.length} traces in ${traces}`);
});

for (const name of names) {
  test(`trace ${name}: the views after every frame are the expected ones`, () => {
    const { frames, expected } = load(name);
    const workers = expected.workers;
    const reducer = new Reducer(sessionOf(frames));
    const steps = new Map(expected.steps.map((step) => [step.after, step]));
    let simple = simpleView(reducer);
    let full = fullView(reducer, { workers });
    frames.forEach((frame, i) => {
      reducer.apply(frame);
      const step = steps.get(i + 1);
      if (step?.simple !== undefined) simple = step.simple;
      if (step?.full !== undefined) full = step.full;
      const where = `${name}, after frame ${i + 1} (${frame.type === "event" ? frame.event.type : frame.type})`;
      assert.deepStrictEqual(simpleView(reducer), simple, `simple view, ${where}`);
      const delta = frame.type === "event" && DELTAS.has(frame.event.type);
      if (!delta) assert.deepStrictEqual(fullView(reducer, { workers }), full, `full view, ${where}`);
    });
    assert.deepStrictEqual(fullView(reducer, { workers }), expected.final.full, `${name}: final full view`);
    assert.deepStrictEqual(simpleView(reducer), expected.final.simple, `${name}: final simple view`);
    assert.equal(reducer.duplicatesIgnored, 0);
  });
}

test("best-effort parsing of a cut JSON object agrees with gateway/partial_json.py", () => {
  const cases = JSON.parse(readFileSync(join(here, "partial_json.json"), "utf8"));
  assert.ok(cases.length > 100);
  for (const { text, parsed } of cases) {
    assert.deepStrictEqual(bestEffort(text), parsed, `bestEffort(${JSON.stringify(text)})`);
  }
});

test("a move the contract does not allow throws, and changes nothing", () => {
  const { frames } = load("plain_text");
  const reducer = new Reducer(sessionOf(frames));
  const started = frames.findIndex((f) => f.type === "event" && f.event.type === "text.start");
  frames.slice(0, started + 1).forEach((frame) => reducer.apply(frame));
  const before = JSON.stringify(fullView(reducer));
  const cursor = reducer.lastEventId;
  const event = frames[started].event;
  const bad = (type, payload) => ({
    type: "event",
    event: { ...event, id: "evt_99999999999999999999", type, payload: { ...event.payload, ...payload } },
  });
  assert.throws(() => reducer.apply(bad("text.delta", { content_block_index: 5, text: "x" })), /never started/);
  assert.throws(() => reducer.apply(bad("text.delta", { message_id: "msg_x", text: "x" })), /msg_x/);
  assert.throws(() => reducer.apply(bad("thinking.end", { signature: null })), /is a text block/);
  assert.throws(() => reducer.apply(bad("text.start", {})), ReducerError);
  assert.equal(JSON.stringify(fullView(reducer)), before);
  assert.equal(reducer.lastEventId, cursor);
});

test("events already seen are ignored and counted", () => {
  const { frames } = load("plain_text");
  const reducer = new Reducer(sessionOf(frames));
  frames.forEach((frame) => reducer.apply(frame));
  const before = JSON.stringify(fullView(reducer));
  frames.forEach((frame) => reducer.apply(frame));
  assert.equal(JSON.stringify(fullView(reducer)), before);
  assert.equal(reducer.duplicatesIgnored, frames.filter((f) => f.type === "event").length);
});

test("a worker's permission request is pending in its parent's stream too (docs/protocol.md §6)", () => {
  const reducer = new Reducer("sess_root");
  const event = (id, type, payload) => ({
    type: "event",
    event: { id, type, session_id: "sess_worker", turn_id: "turn_w", ts: 0, actor: "user", payload },
  });
  const asked = { perm_id: "perm_1", kind: "tool", tool_use_id: "toolu_1", tool_name: "sleep", input: {}, expires_at: 5 };
  reducer.apply(event("evt_00000000000000000001", "permission.requested", asked));
  assert.deepEqual(fullView(reducer).permissions.map((p) => p.perm_id), ["perm_1"]);
  reducer.apply(event("evt_00000000000000000002", "permission.resolved", { perm_id: "perm_1", decision: "cancelled" }));
  assert.deepEqual(fullView(reducer).permissions, []);
});

test("a steer moves the reply below it only when it answered a round (docs/protocol.md §10)", () => {
  // As tests/unit/client/test_reducer_busy.py: the paths the recorded traces do not take.
  let seq = 0;
  const event = (type, payload) => ({
    type: "event",
    event: { id: `evt_${String(++seq).padStart(20, "0")}`, type, session_id: "sess_1", turn_id: "turn_a", ts: 0, actor: "llm", payload },
  });
  const user = (id, text) => ({
    id, session_id: "sess_1", turn_id: "turn_a", role: "user", content: [{ type: "text", text }], status: "complete", created_at: 0,
  });
  const round = (id, text) => [
    event("message.start", { message_id: id, role: "assistant", model: "m" }),
    event("text.start", { message_id: id, content_block_index: 0 }),
    event("text.delta", { message_id: id, content_block_index: 0, text }),
    event("text.end", { message_id: id, content_block_index: 0 }),
    event("message.complete", {
      message_id: id, stop_reason: "end_turn", final_content: [{ type: "text", text }], usage: { input_tokens: 1, output_tokens: 1 },
    }),
  ];
  const entries = (reducer) => simpleView(reducer).thread.map((e) => [e.role, e.text, e.steered === true]);
  const early = new Reducer("sess_1");
  for (const frame of [
    event("turn.started", { turn_id: "turn_a", user_message: user("msg_a", "A") }),
    event("turn.steered", { turn_id: "turn_a", user_message: user("msg_s", "early") }),
    ...round("msg_r1", "One."),
    event("context.compacted", {
      trigger: "auto", method: "summary", pre_tokens: 10, post_tokens: 2, summary_message_id: "msg_ctx", first_kept_message_id: "msg_r1",
    }),
    ...round("msg_r2", "Two."),
  ]) early.apply(frame);
  assert.deepStrictEqual(entries(early), [
    ["user", "A", false], ["user", "early", true], ["assistant", "Two.", false], ["context", "", false],
  ]);
  const late = new Reducer("sess_1");
  for (const frame of [
    event("turn.started", { turn_id: "turn_a", user_message: user("msg_a", "A") }),
    ...round("msg_r1", "Looking."),
    event("turn.steered", { turn_id: "turn_a", user_message: user("msg_s", "also") }),
  ]) late.apply(frame);
  assert.deepStrictEqual(entries(late), [["user", "A", false], ["assistant", "Looking.", false], ["user", "also", true]]);
  for (const frame of round("msg_r2", "Done.")) late.apply(frame);
  assert.deepStrictEqual(entries(late), [["user", "A", false], ["user", "also", true], ["assistant", "Done.", false]]);
  assert.deepStrictEqual(fullView(late).messages.map((m) => m.steered === true), [false, false, true, false]);
});

test("a turn cancelled while queued leaves the queue, the running turn stays (docs/protocol.md §2)", () => {
  const { frames } = load("queue");
  const reducer = new Reducer(sessionOf(frames));
  const cancelled = frames.findIndex((f) => f.type === "event" && f.event.type === "turn.cancelled");
  frames.slice(0, cancelled + 1).forEach((frame) => reducer.apply(frame));
  assert.equal(reducer.runningTurnId, "turn_1");
  assert.deepStrictEqual(simpleView(reducer).queued.map((q) => [q.turn_id, q.position]), [["turn_2", 1], ["turn_4", 2]]);
});

// --- a late or returning client ends where a live one is (docs/protocol.md §10) ----------
//
// As in tests/integration/client/test_conformance.py: at every cut point of every trace, a client built the
// way the server would build it there (a snapshot of the state at the cut; or the replay of
// what it missed, with message.snapshot for a message still streaming) is fed the rest of
// the trace, and must show what the live client shows: at every later frame but for the
// documented windows (masked), and exactly at the end. A client that comes back with `since`
// comes back before the trace's own next snapshot (a hand-written trace's client reattaches
// with one: what that snapshot brings, a compaction's summary, no replay carries).

const CATALOG = new Set([
  "turn.started", "turn.queued", "turn.steered", "route.decided", "llm.call_started", "llm.call_completed", "llm.call_failed",
  "tool.called", "tool.completed", "tool.failed", "permission.requested", "permission.resolved",
  "context.compacting", "context.compacted", "delegate.started", "delegate.completed", "delegate.failed", "feedback.recorded",
  "turn.completed", "turn.cancelled", "bus.handler_warning", "bus.subscriber_unregistered",
  "history.rewound",
]);
const STREAMING = new Set([
  "message.start", "text.start", "text.delta", "text.end", "thinking.start", "thinking.delta",
  "thinking.end", "tool.use_start", "tool.use_input_delta", "tool.use_end", "message.complete",
  "message.snapshot",
]);

function spaced(frames) {
  const text = JSON.stringify(frames).replace(/evt_(\d{20})/g, (_, n) =>
    `evt_${String(Number(n) * 10).padStart(20, "0")}`,
  );
  return JSON.parse(text);
}

function reduce(sessionId, frames, reducer = new Reducer(sessionId)) {
  for (const frame of frames) reducer.apply(structuredClone(frame));
  return reducer;
}

function serverMessage(streaming, sessionId) {
  const sorted = streaming.sortedBlocks();
  const openAt = sorted.findLastIndex(([, block]) => !block.closed);
  return {
    id: streaming.messageId,
    session_id: sessionId,
    turn_id: streaming.turnId,
    role: "assistant",
    content: sorted.map(([, block]) => block.asContentBlock()),
    status: "in_progress",
    created_at: 0,
    model: streaming.model,
    open_block_index: openAt < 0 ? null : openAt,
  };
}

function serverSnapshot(live) {
  const messages = [];
  for (const message of live.messages) {
    messages.push(message);
    const results = message.content
      .filter((b) => b.type === "tool_use" && live.toolResults.has(b.id))
      .map((b) => live.toolResults.get(b.id));
    if (message.role === "assistant" && results.length > 0) {
      messages.push({
        id: `msg_results_${message.id}`,
        session_id: live.sessionId,
        turn_id: message.turn_id,
        role: "user",
        content: results.map((r) => ({
          type: "tool_result",
          tool_use_id: r.tool_use_id,
          content: r.content,
          is_error: r.status === "failed",
          ...(r.files?.length > 0 ? { files: r.files } : {}),
        })),
        status: "complete",
        created_at: 0,
      });
    }
  }
  if (live.streaming !== null) messages.push(serverMessage(live.streaming, live.sessionId));
  const running = live.runningTurnId;
  const session = {
    id: live.sessionId,
    workspace_path: "/workspace",
    active_model: "scripted:echo",
    routing_policy_version: "static-1",
    cost_so_far_usd: 0,
    turn_count: 1,
    current_turn_id: running,
    current_turn_status: running === null ? null : "in_flight",
    parent_session_id: null,
    pending_permissions: [...live.permissions.values()],
  };
  if (live.queued.size > 0) {
    // docs/protocol.md §6: absent when none is queued
    session.queued_turns = [...live.queued.entries()].map(([turnId, message], i) => ({
      turn_id: turnId,
      position: i + 1,
      user_message: message,
    }));
  }
  return structuredClone({
    type: "snapshot",
    session,
    messages,
    snapshot_at_event_id: live.lastEventId,
  });
}

function messageOf(frame) {
  const payload = frame.event.payload;
  return "message" in payload ? payload.message.id : payload.message_id;
}

function serverReplay(frames, cut, now, server) {
  const missed = frames.slice(cut, now).filter((f) => f.type === "event");
  const replay = missed.filter((f) => CATALOG.has(f.event.type) || f.event.type === "message.complete");
  const ids = frames.slice(0, now).filter((f) => f.type === "event").map((f) => f.event.id);
  if (ids.length === 0) return replay;
  let seq = Number(ids.sort().at(-1).slice(4));
  for (const reducer of [server, ...server.workers.values()]) {
    const streaming = reducer.streaming;
    if (streaming === null) continue;
    if (!missed.some((f) => STREAMING.has(f.event.type) && messageOf(f) === streaming.messageId)) continue;
    seq += 1;
    replay.push({
      type: "event",
      event: {
        id: `evt_${String(seq).padStart(20, "0")}`,
        type: "message.snapshot",
        session_id: reducer.sessionId,
        turn_id: streaming.turnId,
        ts: 0,
        actor: "llm",
        payload: { message: serverMessage(streaming, reducer.sessionId) },
      },
    });
  }
  return structuredClone(replay);
}

function views(reducer, workers = false) {
  return { full: fullView(reducer, { workers }), simple: simpleView(reducer) };
}

function masked(shown) {
  const copy = structuredClone(shown);
  for (const message of copy.full.messages) {
    for (const block of message.blocks) if (block.type === "tool_use" && block.open) block.input = "(streaming)";
  }
  if (copy.simple.status !== null && copy.simple.status.kind === "thinking") copy.simple.status.text = "(a chunk)";
  // A snapshot cannot say a compaction is under way (docs/protocol.md §12).
  if (copy.simple.status !== null && copy.simple.status.kind === "compacting") copy.simple.status = null;
  return copy;
}

function cuts(frames) {
  const points = [];
  frames.forEach((frame, i) => {
    if (frame.type === "event" || frame.type === "snapshot") points.push(i + 1);
  });
  return points;
}

function follow(live, other, rest, workers, where) {
  rest.forEach((frame, i) => {
    live.apply(structuredClone(frame));
    other.apply(structuredClone(frame));
    assert.deepStrictEqual(masked(views(other, workers)), masked(views(live, workers)), `${where}, +${i + 1}`);
  });
  assert.deepStrictEqual(views(other, workers), views(live, workers), `${where}, at the end`);
}

for (const name of names) {
  test(`trace ${name}: a snapshot at any cut shows what a live client shows`, () => {
    const frames = spaced(load(name).frames);
    const sid = sessionOf(frames);
    for (const cut of cuts(frames)) {
      const live = reduce(sid, frames.slice(0, cut));
      const late = new Reducer(sid).apply(serverSnapshot(live));
      const where = `${name}: snapshot after frame ${cut}`;
      assert.deepStrictEqual(masked(views(late)), masked(views(live)), where);
      follow(live, late, frames.slice(cut), false, where); // a snapshot shows no worker
    }
  });

  test(`trace ${name}: a resume with since at any cut shows what a live client shows`, () => {
    const { frames: recorded, expected } = load(name);
    const frames = spaced(recorded);
    const sid = sessionOf(frames);
    const points = cuts(frames);
    for (const cut of points) {
      const nows = [cut, cut + 2, frames.length].filter(
        (n) => n === cut || (points.includes(n) && !frames.slice(cut, n).some((f) => f.type === "snapshot")),
      );
      for (const now of [...new Set(nows)].sort((a, b) => a - b)) {
        const server = reduce(sid, frames.slice(0, now));
        const resumed = reduce(sid, frames.slice(0, cut));
        for (const frame of serverReplay(frames, cut, now, server)) resumed.apply(frame);
        const where = `${name}: left after frame ${cut}, back after ${now}`;
        assert.deepStrictEqual(masked(views(resumed, expected.workers)), masked(views(server, expected.workers)), where);
        follow(server, resumed, frames.slice(now), expected.workers, where);
      }
    }
  });
}
