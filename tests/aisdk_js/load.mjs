// The `ai` package (ESM) from a node_modules directory given on the command line
// (tests/system/doors/aisdk/test_aisdk_js.py installs it there with npm).
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

export async function load(modules, name) {
  const require = createRequire(path.join(modules, "package.json"));
  return import(pathToFileURL(require.resolve(name)).href);
}

// Every UIMessage snapshot readUIMessageStream makes of `stream`, and the errors it reports.
export async function assemble(ai, stream, message) {
  const errors = [];
  let last = message;
  const onError = (error) => errors.push(String(error?.message ?? error));
  for await (const snapshot of ai.readUIMessageStream({ stream, message, onError })) {
    last = snapshot;
  }
  return { message: last, errors };
}

// A copy of a chunk stream, each chunk recorded in `into` as it passes.
export function recording(stream, into) {
  return stream.pipeThrough(new TransformStream({
    transform(chunk, controller) { into.push(chunk); controller.enqueue(chunk); },
  }));
}
