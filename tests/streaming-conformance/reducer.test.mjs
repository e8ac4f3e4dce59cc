// The JS reducer (gateway/ui/reducer.js) against the recorded traces: node --test tests/streaming-conformance/
//
// Each trace (traces/NAME.jsonl: the server frames one client received) is fed to the
// reducer frame by frame. After every frame the simple view must equal the last one the
// expected file recorded, and after every frame that is not a delta the full view too
// (traces/NAME.expected.json, written by record.py from the Python reference; see README.md).
// The same files drive tests/test_conformance.py, so both languages agree frame by frame.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Reducer, ReducerError, bestEffort, fullView, simpleView } from "../../gateway/ui/reducer.js";

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
