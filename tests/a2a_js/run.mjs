// The official A2A JS client (@a2a-js/sdk) against a running gateway (docs/doors/a2a.md).
// Usage: node run.mjs NODE_MODULES BASE_URL KEY
// Reads the card, streams a task to its end, drops a second task's stream mid-reply and
// resubscribes from its cursor (Last-Event-ID), reads both with getTask, and asks for a
// task of another key. Prints one JSON object; any protocol violation throws (exit 1).
import { createRequire } from "node:module";
import path from "node:path";

const [, , modules, base, key, otherKey] = process.argv;
const require = createRequire(path.join(modules, "noop.js"));
const sdk = await import(require.resolve("@a2a-js/sdk/client"));
const { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } = sdk;

function clientFor(token) {
  const fetchImpl = (url, init = {}) => {
    const headers = new Headers(init.headers || {});
    headers.set("Authorization", `Bearer ${token}`);
    return fetch(url, { ...init, headers });
  };
  const options = ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl })],
    cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
  });
  return new ClientFactory(options).createFromUrl(base);
}

function ask(text) {
  return {
    message: {
      messageId: `m-${Math.random()}`,
      role: 1, // ROLE_USER
      parts: [{ content: { $case: "text", value: text } }],
    },
  };
}

function summary(events) {
  const out = { kinds: [], states: [], text: "", cursors: [] };
  for (const e of events) {
    const { $case, value } = e.payload;
    out.kinds.push($case);
    if ($case === "task") out.states.push(`task:${value.status.state}`);
    if ($case === "statusUpdate") out.states.push(value.status.state);
    if ($case === "artifactUpdate")
      for (const p of value.artifact.parts) out.text += p.content.value;
    if (value.metadata && value.metadata.cursor) out.cursors.push(value.metadata.cursor);
  }
  return out;
}

const client = await clientFor(key);
const whole = [];
for await (const e of client.sendMessageStream(ask(process.env.WHOLE))) whole.push(e);
const wholeTask = whole[0].payload.value;
const got = await client.getTask({ id: wholeTask.id });

const first = [];
for await (const e of client.sendMessageStream(ask(process.env.DROPPED))) {
  first.push(e);
  if (summary(first).text.split(" ").length > 20) break; // the stream dropped mid-reply
}
const dropped = first[0].payload.value;
const cursor = summary(first).cursors.at(-1);
const rest = [];
const resume = { serviceParameters: { "Last-Event-ID": cursor } };
for await (const e of client.resubscribeTask({ id: dropped.id }, resume)) rest.push(e);
const droppedTask = await client.getTask({ id: dropped.id });

let otherError = null;
try {
  await (await clientFor(otherKey)).getTask({ id: wholeTask.id });
} catch (err) {
  otherError = err.constructor.name;
}

console.log(
  JSON.stringify({
    whole: summary(whole),
    got: { state: got.status.state, text: got.artifacts[0].parts[0].content.value },
    first: summary(first),
    rest: summary(rest),
    dropped: droppedTask.artifacts[0].parts[0].content.value,
    otherError,
  }),
);
