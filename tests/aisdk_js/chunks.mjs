// The gateway's UI message chunks as the `ai` package reads them (tests/system/doors/aisdk/test_aisdk_js.py).
//
// Usage: node chunks.mjs NODE_MODULES_DIR CHUNKS.json
// CHUNKS.json: {"trace/turn/subscription": [chunk, ...]}, every response the mapping makes
// of the recorded traces. Each chunk is validated by the package's own
// `uiMessageChunkSchema`; each response is assembled by `readUIMessageStream`.
// Prints {key: {invalid: [...], errors: [...], message: UIMessage}}.
import { readFileSync } from "node:fs";
import { assemble, load } from "./load.mjs";

const [modules, file] = process.argv.slice(2);
const ai = await load(modules, "ai");
const { safeValidateTypes } = await load(modules, "@ai-sdk/provider-utils");

const responses = JSON.parse(readFileSync(file, "utf8"));
const out = {};
for (const [key, chunks] of Object.entries(responses)) {
  const invalid = [];
  for (const [i, chunk] of chunks.entries()) {
    const checked = await safeValidateTypes({ value: chunk, schema: ai.uiMessageChunkSchema });
    if (!checked.success) invalid.push({ i, chunk, error: String(checked.error?.message) });
  }
  const { message, errors } = await assemble(ai, ReadableStream.from(chunks));
  out[key] = { invalid, errors, message };
}
process.stdout.write(JSON.stringify(out));
