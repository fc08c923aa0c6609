// The two wasm builds (web/build.sh) through pkg/load.js: on a cross-origin isolated page the
// cpu backend loads the threaded build (a pool of Web Workers), on a page without isolation the
// one-thread build; both, on the page and in createWorkerModel's worker, must generate the same
// tokens as the one-thread build. The prompt is long enough that the prefill's products are
// split across the pool (parallel.rs fans out above 16K element-copies).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { withBrowser, startServer } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

const PROMPT = "And God said, Let there be light: and there was light. ".repeat(8);

/// Loads webtensor through load.js with `threads` on `page` (blank.html: isolated; plain.html:
/// not), and generates greedily and sampled (seeded) on the page and in a worker model.
async function generateOn(pageName, threads) {
  return await withBrowser({ webgpu: false }, async (browser) => {
    await browser.page.goto(`${server.url}tests/${pageName}`);
    return await browser.page.evaluate(
      async ({ prompt, threads }) => {
        const { loadWebtensor, pickBuild } = await import("/pkg/load.js");
        const options = { backend: "cpu", threads };
        const wt = await loadWebtensor(options);
        const device = await wt.createDevice("cpu");
        const model = await wt.Model.builtin(device);
        const greedy = { maxTokens: 12, temperature: 0 };
        const sampled = { maxTokens: 12, temperature: 0.9, seed: 7 };
        const texts = [(await model.generate(prompt, greedy)).text, (await model.generate(prompt, sampled)).text];
        // Worker models started from the build load.js chose and from the one-thread build (the
        // demo's way): each worker picks its build itself.
        const oneThread = await import("/pkg/webtensor.js");
        await oneThread.default();
        const workers = [];
        for (const from of [wt, oneThread]) {
          const worker = await from.createWorkerModel(options);
          let pieces = 0;
          const workerGreedy = await worker.generate(prompt, greedy, () => pieces++);
          const texts = [workerGreedy.text, (await worker.generate(prompt, sampled)).text];
          workers.push({ threads: worker.deviceInfo.info.threads, texts, pieces, generated: workerGreedy.generatedTokens });
          worker.terminate();
        }
        return {
          isolated: globalThis.crossOriginIsolated,
          build: pickBuild(options),
          threaded: wt.threaded(),
          threads: device.info().info.threads,
          texts,
          workers,
        };
      },
      { prompt: PROMPT, threads },
    );
  });
}

test("threads on an isolated page, the one-thread build without isolation: the same tokens", { timeout: 600_000 }, async () => {
  const threaded = await generateOn("blank.html", 2);
  const oneThread = await generateOn("blank.html", 1);
  const plain = await generateOn("plain.html", 2);

  assert.equal(threaded.isolated, true);
  assert.equal(threaded.build, "threads");
  assert.equal(threaded.threaded, true, "an isolated page with backend cpu loads the threaded build");
  assert.equal(threaded.threads, 2, "the page's pool has the threads asked for");
  assert.deepEqual(threaded.workers.map((w) => w.threads), [2, 2], "the worker models run the threaded build too");

  assert.equal(oneThread.threaded, false, "threads: 1 loads the one-thread build");
  assert.equal(oneThread.threads, 1);
  assert.equal(plain.isolated, false);
  assert.equal(plain.build, "one-thread");
  assert.equal(plain.threaded, false, "without isolation the page falls back to the one-thread build");
  assert.equal(plain.threads, 1);
  assert.deepEqual(plain.workers.map((w) => w.threads), [1, 1], "and so do its workers");
  assert.deepEqual(oneThread.workers.map((w) => w.threads), [1, 1]);

  const reference = oneThread.texts;
  assert.ok(reference[0].length > 0 && reference[0] !== reference[1], JSON.stringify(reference));
  for (const [name, r] of Object.entries({ threaded, oneThread, plain })) {
    assert.deepEqual(r.texts, reference, `${name}: the page's tokens`);
    for (const [i, w] of r.workers.entries()) {
      assert.deepEqual(w.texts, reference, `${name}: worker ${i}'s tokens`);
      assert.equal(w.pieces, w.generated, `${name}: worker ${i}: one piece per token`);
    }
  }
});
