// The demo page with a Q4_K_M GGUF picked as a file: the built-in model widened to whole K-quant
// super-blocks and quantized by llama.cpp, vocabulary included (native-tests/fixtures/kjv_q4_k_m,
// scripts/kjv_q4_k_m.py). On WebGPU, and on the cpu fallback without it, the page names the file
// and its formats (Q4_K_M: q4_k with q6_k, nothing else), and a greedy generation continues the
// prompt with llama.cpp's own greedy text on that file (the fixture's record). Screenshots go to
// target/browser-artifacts. Run by scripts/test.sh after web/build.sh.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { ARTIFACTS, IN_CI, ROOT, withBrowser, startServer } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

const FIXTURE = path.join(ROOT, "native-tests/fixtures/kjv_q4_k_m/tiny-kjv-256.q4_k_m.gguf");
/// llama.cpp's prompt and greedy continuation on FIXTURE.
const LLAMA_CPP = JSON.parse(readFileSync(`${FIXTURE}.llama_cpp.json`, "utf8"));

async function settled(page, state) {
  await page.waitForSelector(`body[data-state=${state}]`, { timeout: 180_000 });
}

/// Opens the demo (with `query`: "?backend=wgpu" asks for WebGPU, which the page otherwise leaves
/// for cpu on a software adapter), loads FIXTURE through the "GGUF file" input, generates
/// LLAMA_CPP's number of greedy tokens after its prompt, and returns what the page shows.
async function generateWithFixture(page, query = "") {
  await page.goto(`${server.url}${query}`);
  await settled(page, "ready");
  const backend = await page.textContent("#backend-status");
  await page.check("input[name=source][value=gguf]");
  await page.setInputFiles("#gguf-file", FIXTURE);
  await page.click("#load");
  await settled(page, "ready");
  await page.fill("#prompt", LLAMA_CPP.prompt);
  await page.fill("#max-tokens", String(LLAMA_CPP.greedy_ids.length));
  await page.fill("#temperature", "0");
  await page.click("#generate");
  await settled(page, "done");
  return {
    backend,
    model: await page.textContent("#model-status"),
    output: await page.textContent("#output"),
    stats: await page.textContent("#gen-stats"),
  };
}

/// The page ran FIXTURE on `backend`: its model line names the file, its shape and exactly the
/// formats q4_k and q6_k, and the output is the prompt followed by llama.cpp's greedy text.
function assertRanFixture(r, backend) {
  assert.match(r.model, new RegExp(`^tiny-kjv-256\\.q4_k_m\\.gguf: 4 layers, hidden 256, vocabulary 512, on ${backend}; `));
  const formats = [...r.model.matchAll(/(\w+) weights ×/g)].map((m) => m[1]).sort();
  assert.deepEqual(formats, ["q4_k", "q6_k"], `formats in: ${r.model}`);
  assert.equal(r.output, LLAMA_CPP.prompt + LLAMA_CPP.greedy_text);
  assert.match(r.stats, new RegExp(`^${LLAMA_CPP.greedy_ids.length} tokens · [\\d.]+ tokens/s on ${backend}`));
}

test("the demo loads a Q4_K_M GGUF file and generates llama.cpp's greedy text on WebGPU", { timeout: 400_000 }, async (t) => {
  await withBrowser({ webgpu: true }, async (browser) => {
    const r = await generateWithFixture(browser.page, "?backend=wgpu");
    if (!/Backend: wgpu/.test(r.backend)) {
      if (IN_CI) assert.fail(`CI needs a WebGPU adapter (SwiftShader): ${r.backend}`);
      return t.skip(`no WebGPU: ${r.backend}`);
    }
    t.diagnostic(`${r.model} | ${r.stats}`);
    assertRanFixture(r, "wgpu");
    await browser.page.screenshot({ path: path.join(ARTIFACTS, "demo-q4_k_m.png"), fullPage: true });
  });
});

test("without WebGPU the demo runs the Q4_K_M GGUF file on cpu with llama.cpp's greedy text", { timeout: 300_000 }, async (t) => {
  await withBrowser({ webgpu: false }, async (browser) => {
    const r = await generateWithFixture(browser.page);
    t.diagnostic(`${r.model} | ${r.stats}`);
    assert.match(r.backend, /fell back to the cpu backend/);
    assertRanFixture(r, "cpu");
  });
});
