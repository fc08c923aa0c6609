// The browser's generation API: `for await` over Model.generate, AbortSignals that stop a
// generation during a long prompt (answered within a chunk, counted in prompt tokens) and
// cancel a load, and createWorkerModel running the same loop in a Web Worker (the demo's way).
// On the cpu backend (wasm), which is where a long prompt takes seconds. Run with the other
// browser tests (scripts/test.sh: npm test in web/tests).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { ROOT, withBrowser, startServer } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

/// A small GGUF the page can fetch at /tests/models/abort.gguf (a load to cancel).
const GGUF = path.join(ROOT, "native-tests/fixtures/gguf/llama31.q8_0.gguf");

/// Runs `fn` in a blank test page (cross-origin isolated) and returns its result.
async function inPage(fn, arg) {
  return await withBrowser({ webgpu: false }, async (browser) => {
    await browser.page.route("**/tests/models/abort.gguf", (route) =>
      route.fulfill({ status: 200, contentType: "application/octet-stream", body: readFileSync(GGUF) }),
    );
    await browser.page.goto(`${server.url}tests/blank.html`);
    return await browser.page.evaluate(fn, arg);
  });
}

const LONG_PROMPT = "And God said, Let there be light: and there was light. ".repeat(12);

test("for await streams the pieces, and an AbortSignal stops a long prompt at the next chunk", { timeout: 300_000 }, async () => {
  const r = await inPage(async (longPrompt) => {
    const wt = await import("/pkg/webtensor.js");
    await wt.default();
    const dev = await wt.createDevice("cpu");
    const model = await wt.Model.builtin(dev);
    const greedy = { maxTokens: 20, temperature: 0 };
    // The callback form and the iterator form give the same text.
    const callbackPieces = [];
    const viaCallback = await model.generate("And God said", greedy, (piece) => callbackPieces.push(piece));
    const pieces = [];
    const generation = model.generate("And God said", greedy);
    for await (const piece of generation) pieces.push(piece);
    const viaIterator = await generation;
    // Leaving the loop early stops the generation.
    const early = model.generate("And God said", { maxTokens: 200 });
    let seen = 0;
    for await (const _ of early) if (++seen === 3) break;
    const broken = await early;
    // An abort during a long prompt, cut into chunks of 4 tokens: the signal is aborted from a
    // task that runs at the loop's first yield, after the first chunk.
    const controller = new AbortController();
    const aborted = model.generate(longPrompt, { maxTokens: 5, promptChunk: 4, signal: controller.signal });
    setTimeout(() => controller.abort(), 0);
    const abortStats = await aborted;
    const full = await model.generate(longPrompt, { maxTokens: 1, promptChunk: 4 });
    const rejected = async (p) => p.then(() => "resolved", (e) => `${e.name}: ${e.message}`);
    const gone = new AbortController();
    gone.abort();
    return {
      callback: callbackPieces.join(""),
      callbackText: viaCallback.text,
      iterator: pieces.join(""),
      iteratorStats: viaIterator,
      brokenStopped: broken.stopped,
      brokenGenerated: broken.generatedTokens,
      abort: abortStats,
      full,
      preAborted: await rejected(model.generate("x", { signal: gone.signal })),
      loadAborted: await rejected(wt.Model.builtin(dev, null, gone.signal)),
      urlAborted: await rejected(
        (() => {
          const c = new AbortController();
          const p = wt.Model.fromUrl(dev, "/tests/models/abort.gguf", (phase) => phase === "download" && c.abort(), c.signal);
          return p;
        })(),
      ),
      notASignal: await rejected(model.generate("x", { signal: 3 })),
    };
  }, LONG_PROMPT);
  assert.ok(r.callback.length > 20, r.callback);
  assert.equal(r.callback, r.callbackText);
  assert.equal(r.iterator, r.callback, "the iterator gives the callback's text");
  assert.equal(r.iteratorStats.text, r.iterator);
  assert.equal(r.iteratorStats.generatedTokens, 20);
  assert.ok(r.brokenStopped, "leaving the loop stops the generation");
  assert.ok(r.brokenGenerated < 10, `${r.brokenGenerated} tokens after a break at the third piece`);
  // The long prompt is many chunks; the abort is answered after one (two at most).
  assert.ok(r.full.promptTokens > 100, `${r.full.promptTokens}`);
  assert.equal(r.full.promptTokensRun, r.full.promptTokens);
  assert.ok(r.abort.stopped, JSON.stringify(r.abort));
  assert.equal(r.abort.generatedTokens, 0);
  assert.ok(r.abort.promptTokensRun >= 4 && r.abort.promptTokensRun <= 8, `${r.abort.promptTokensRun} prompt tokens ran after the abort`);
  assert.match(r.preAborted, /^AbortError/);
  assert.match(r.loadAborted, /^AbortError/);
  assert.match(r.urlAborted, /^AbortError/);
  assert.match(r.notASignal, /AbortSignal/);
});

test("createWorkerModel loads and generates in a Web Worker with the same API", { timeout: 300_000 }, async () => {
  const r = await inPage(async (longPrompt) => {
    const wt = await import("/pkg/webtensor.js");
    await wt.default();
    const greedy = { maxTokens: 20, temperature: 0 };
    const here = await (await wt.Model.builtin(await wt.createDevice("cpu"))).generate("And God said", greedy);
    const phases = new Set();
    const model = await wt.createWorkerModel({ backend: "cpu", progress: (phase) => phases.add(phase) });
    const pieces = [];
    let calls = 0;
    const generation = model.generate("And God said", greedy, () => calls++);
    for await (const piece of generation) pieces.push(piece);
    const stats = await generation;
    // An abort during a long prompt in the worker.
    const controller = new AbortController();
    const aborted = model.generate(longPrompt, { maxTokens: 5, promptChunk: 4, signal: controller.signal });
    let firstPieceSeen = false;
    const watcher = (async () => {
      for await (const _ of aborted) firstPieceSeen = true;
    })();
    controller.abort();
    const abortStats = await aborted;
    await watcher;
    const rejected = async (p) => p.then(() => "resolved", (e) => `${e.name}: ${e.message}`);
    const busy = model.generate("And God said", { maxTokens: 200 });
    const second = await rejected(model.generate("x"));
    model.stop();
    const stoppedStats = await busy;
    const gone = new AbortController();
    gone.abort();
    const result = {
      here: here.text,
      worker: pieces.join(""),
      stats,
      calls,
      phases: [...phases].sort(),
      name: model.name,
      layers: model.config().num_hidden_layers,
      backend: model.backend,
      abort: abortStats,
      firstPieceSeen,
      second,
      stopped: stoppedStats.stopped,
      badOptions: await rejected(model.generate("x", { temperature: -1 })),
      loadAborted: await rejected(wt.createWorkerModel({ backend: "cpu", signal: gone.signal })),
    };
    model.terminate();
    return result;
  }, LONG_PROMPT);
  assert.equal(r.worker, r.here, "the worker generates the page's greedy text");
  assert.equal(r.stats.text, r.worker);
  assert.equal(r.stats.generatedTokens, 20);
  assert.equal(r.calls, 20, "the callback gets every token");
  assert.deepEqual(r.phases, ["parse", "upload"]);
  assert.match(r.name, /\w/);
  assert.ok(r.layers > 0);
  assert.equal(r.backend, "cpu");
  assert.ok(r.abort.stopped && r.abort.generatedTokens === 0, JSON.stringify(r.abort));
  assert.ok(r.abort.promptTokensRun < r.abort.promptTokens, `${r.abort.promptTokensRun} of ${r.abort.promptTokens}`);
  assert.equal(r.firstPieceSeen, false);
  assert.match(r.second, /already generating/);
  assert.ok(r.stopped);
  assert.match(r.badOptions, /temperature/);
  assert.match(r.loadAborted, /^AbortError/);
});

test("the demo loads and generates in a Web Worker", { timeout: 300_000 }, async () => {
  await withBrowser({ webgpu: false }, async (browser) => {
    const { page } = browser;
    await page.goto(server.url);
    await page.waitForSelector("body[data-state=ready]", { timeout: 180_000 });
    const workers = page.workers().map((w) => w.url());
    assert.ok(workers.some((u) => /\/worker\.js$/.test(u)), `workers: ${workers.join(", ")}`);
    // Stop reaches the generation in the worker.
    await page.fill("#max-tokens", "1000");
    await page.click("#generate");
    await page.waitForFunction(() => /tokens/.test(document.getElementById("gen-stats").textContent));
    await page.click("#stop");
    await page.waitForSelector("body[data-state=done]", { timeout: 120_000 });
    assert.match(await page.textContent("#gen-stats"), /\(stopped\)/);
  });
});
