// The browser tests: the conformance subset on WebGPU and cpu against the reference, files
// written by llama.cpp's quantizer against llama.cpp's logits (and on the wasm cpu with simd128
// against its scalar path, bit for bit), the demo
// page generating with the built-in model (screenshot kept), a long generation on WebGPU
// against the cpu backend's, Model.chat over a chat template, the cpu fallback without
// WebGPU, and the benchmark tab's report. Run by scripts/test.sh after web/build.sh.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { ARTIFACTS, IN_CI, ROOT, withBrowser, startServer } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

/// Why WebGPU is unusable in `page`, or null. Outside CI a missing adapter skips; in CI it fails.
async function webgpuReason(page, t) {
  await page.goto(`${server.url}tests/blank.html`);
  const reason = await page.evaluate(async () => {
    const m = await import("/pkg/webtensor.js");
    await m.default();
    return (await m.webgpuUnavailableReason()) ?? null;
  });
  if (reason && IN_CI) assert.fail(`CI needs a WebGPU adapter (SwiftShader): ${reason}`);
  if (reason) t.skip(`no WebGPU adapter: ${reason}`);
  return reason;
}

async function conformance(t, backend) {
  await withBrowser({ webgpu: true }, async (browser) => {
    if (backend === "wgpu" && (await webgpuReason(browser.page, t))) return;
    await browser.page.goto(`${server.url}tests/blank.html`);
    const result = await browser.page.evaluate(async (b) => (await import("/tests/conformance-cases.js")).run(b), backend);
    t.diagnostic(`${result.cases} cases on ${result.backend} (${result.adapter})`);
    assert.equal(result.backend, backend);
    assert.ok(result.cases > 150, `only ${result.cases} cases ran`);
    assert.deepEqual(result.failures, [], result.failures.slice(0, 20).join("\n"));
  });
}

test("conformance subset on WebGPU (SwiftShader) against the reference", { timeout: 300_000 }, (t) => conformance(t, "wgpu"));

test("conformance subset on the cpu backend (wasm simd128) against the reference", { timeout: 300_000 }, (t) => conformance(t, "cpu"));

test("models load from a picked folder and from URLs, with typed errors", { timeout: 300_000 }, async () => {
  await withBrowser({ webgpu: false }, async (browser) => {
    await browser.page.goto(`${server.url}tests/blank.html`);
    const r = await browser.page.evaluate(async () => {
      const wt = await import("/pkg/webtensor.js");
      await wt.default();
      const dev = await wt.createDevice("cpu");
      const greedy = { maxTokens: 24, temperature: 0 };
      const builtin = await (await wt.Model.builtin(dev)).generate("And God said", greedy);
      // The same model as a folder of files, as <input webkitdirectory> gives them.
      const files = [];
      for (const name of ["config.json", "tokenizer.json", "model.safetensors"]) {
        const blob = await (await fetch(`/tests/tiny-kjv/${name}`)).blob();
        files.push(new File([blob], name));
      }
      const phases = new Set();
      const uploads = [];
      const folder = await wt.Model.fromFiles(dev, files, (phase, done, total) => {
        phases.add(phase);
        if (phase === "upload") uploads.push([done, total]);
      });
      const fromFolder = await folder.generate("And God said", greedy);
      const rejected = async (p) => p.then(() => "resolved", (e) => (e instanceof Error ? e.message : `not an Error: ${e}`));
      // The same weights as the one shard an index lists, as sharded checkpoints are saved
      // (read by the library's folder rules, as natively).
      const shard = "model-00001-of-00001.safetensors";
      const sharded = [
        files[0],
        files[1],
        new File([files[2]], shard),
        new File([JSON.stringify({ weight_map: { "lm_head.weight": shard } })], "model.safetensors.index.json"),
      ];
      const fromShards = await (await wt.Model.fromFiles(dev, sharded)).generate("And God said", greedy);
      return {
        builtin: builtin.text,
        folder: fromFolder.text,
        phases: [...phases],
        uploads,
        layers: folder.config().num_hidden_layers,
        shards: fromShards.text,
        noWeights: await rejected(wt.Model.fromFiles(dev, files.slice(0, 2))),
        missingShard: await rejected(wt.Model.fromFiles(dev, [files[0], files[1], sharded[3]])),
        missing: await rejected(wt.Model.fromUrl(dev, "/tests/tiny-kjv/nothing.gguf")),
        notGguf: await rejected(wt.Model.fromUrl(dev, "/tests/tiny-kjv/model.safetensors")),
        badOptions: await rejected(folder.generate("x", { temperature: -1 })),
        unknownBackend: await rejected(wt.createDevice("tpu")),
      };
    });
    assert.ok(r.builtin.length > 20, r.builtin);
    assert.equal(r.folder, r.builtin, "the folder and the built-in model generate the same greedy text");
    assert.equal(r.shards, r.builtin, "a sharded folder loads the shards its index lists");
    assert.match(r.noWeights, /no model\.safetensors/);
    assert.match(r.missingShard, /model-00001-of-00001\.safetensors, which is not among the picked files/);
    assert.deepEqual(r.phases.sort(), ["parse", "read", "upload"]);
    // The upload reports every layer as it reaches the device, then the output head.
    const steps = r.layers + 1;
    assert.deepEqual(r.uploads.filter(([done]) => done > 0), Array.from({ length: steps }, (_, i) => [i + 1, steps]));
    assert.match(r.missing, /HTTP 404/);
    assert.match(r.notGguf, /tiny-kjv\/model\.safetensors/);
    assert.match(r.badOptions, /temperature/);
    assert.match(r.unknownBackend, /tpu/);
  });
});

/// RMS distance between two equal-length arrays.
const rms = (a, b) => Math.sqrt(a.reduce((s, v, i) => s + (v - b[i]) ** 2, 0) / a.length);

test("GGUF files from llama.cpp's quantizer (Q4_K_M with Q6_K, IQ4_NL) give llama.cpp's logits on WebGPU and the wasm cpu", { timeout: 300_000 }, async (t) => {
  const dir = path.join(ROOT, "native-tests/fixtures/llama_cpp_kquants");
  const floats = (file) => {
    const b = readFileSync(path.join(dir, file));
    return Array.from(new Float32Array(b.buffer, b.byteOffset, b.length / 4));
  };
  for (const backend of ["cpu", "wgpu"]) {
    await withBrowser({ webgpu: true }, async (browser) => {
      if (backend === "wgpu" && (await webgpuReason(browser.page, t))) return;
      await browser.page.goto(`${server.url}tests/blank.html`);
      for (const mix of ["q4_k_m", "iq4_nl"]) {
        const file = `tiny.${mix}.gguf`;
        const manifest = JSON.parse(readFileSync(path.join(dir, `${file}.json`), "utf8"));
        const r = await browser.page.evaluate(
          async ({ backend, file, prompt }) => {
            const wt = await import("/pkg/webtensor.js");
            await wt.default();
            const dev = await wt.createDevice(backend);
            const model = await wt.Model.fromUrl(dev, `/tests/kquants/${file}`);
            const noText = await model.generate("x").then(() => "resolved", (e) => e.message);
            return { backend: dev.backend, logits: Array.from(await model.eval(prompt)), noText };
          },
          { backend, file, prompt: manifest.prompt },
        );
        assert.equal(r.backend, backend);
        const llamaCpp = floats(`${file}.llama_cpp.f32`);
        assert.equal(r.logits.length, llamaCpp.length, `${file}: one row of logits per prompt token`);
        // As natively (native-tests/llama_cpp_agreement.rs): within 1.5x of the distance
        // llama.cpp's own logits keep from a float64 forward over gguf-py's values.
        const spread = rms(llamaCpp, floats(`${file}.logits.f32`));
        const err = rms(r.logits, llamaCpp);
        t.diagnostic(`${file} on ${backend}: ${err.toExponential(2)} from llama.cpp (llama.cpp ${spread.toExponential(2)} from float64)`);
        assert.ok(spread > 0 && err <= 1.5 * spread, `${file} on ${backend}: ${err} from llama.cpp's logits, bound ${1.5 * spread}`);
        assert.match(r.noText, /no tokenizer/);
      }
    });
  }
});

test("K-quant files on the wasm cpu: the simd128 kernels give the scalar path's logits bit for bit", { timeout: 300_000 }, async (t) => {
  // Q4_K_M holds Q4_K and Q6_K weights, Q5_K_M Q5_K and Q6_K (kquant_dot.rs), Q3_K_M Q3_K
  // (int_dot.rs's sums of 16). The prompt's first token alone runs decode's shapes (up to four
  // weight rows against one activation row), its first two to four tokens prefill's (one weight
  // row against two to four activation rows). Only the first four: the f32 ops (attention's
  // dots) may differ between levels by an ulp, within their tolerance, and past four tokens of
  // these files such a difference can move an int8 rounding of the next layer.
  const dir = path.join(ROOT, "native-tests/fixtures/llama_cpp_kquants");
  await withBrowser({ webgpu: false }, async (browser) => {
    await browser.page.goto(`${server.url}tests/blank.html`);
    for (const mix of ["q4_k_m", "q5_k_m", "q3_k_m"]) {
      const file = `tiny.${mix}.gguf`;
      const { prompt } = JSON.parse(readFileSync(path.join(dir, `${file}.json`), "utf8"));
      const r = await browser.page.evaluate(
        async ({ file, prompt }) => {
          const wt = await import("/pkg/webtensor.js");
          await wt.default();
          const run = async (simd) => {
            const dev = await wt.createDevice({ backend: "cpu", cpu: { simd } });
            const model = await wt.Model.fromUrl(dev, `/tests/kquants/${file}`);
            const logits = [];
            for (let n = 1; n <= 4; n++) logits.push(Array.from(await model.eval(prompt.slice(0, n))));
            return { simd: dev.info().info.simd, logits };
          };
          return { vector: await run("simd128"), scalar: await run("scalar") };
        },
        { file, prompt },
      );
      assert.equal(r.vector.simd, "simd128", `${file}: the simd128 level was not in effect`);
      assert.equal(r.scalar.simd, "scalar");
      r.vector.logits.forEach((logits, i) => {
        const want = r.scalar.logits[i];
        // Object.is per value: -0 and NaN compared as bits would be, not as numbers.
        const same = logits.length === want.length && logits.length > 0 && logits.every((v, j) => Object.is(v, want[j]));
        assert.ok(same, `${file}: the logits of the first ${i + 1} tokens differ between simd128 and scalar`);
      });
      t.diagnostic(`${file}: the logits of 1 to 4 tokens identical on simd128 and scalar`);
    }
  });
});

test("Model.chat renders the model's chat template (ChatML without one) and takes turns", { timeout: 300_000 }, async () => {
  await withBrowser({ webgpu: false }, async (browser) => {
    await browser.page.goto(`${server.url}tests/blank.html`);
    const r = await browser.page.evaluate(async () => {
      const wt = await import("/pkg/webtensor.js");
      await wt.default();
      const dev = await wt.createDevice("cpu");
      const rejected = async (p) => p.then(() => "resolved", (e) => (e instanceof Error ? e.message : `not an Error: ${e}`));
      // The built-in model's folder plus a tokenizer_config.json with a chat template whose
      // turns end with </s>.
      const files = [];
      for (const name of ["config.json", "tokenizer.json", "model.safetensors"]) {
        const blob = await (await fetch(`/tests/tiny-kjv/${name}`)).blob();
        files.push(new File([blob], name));
      }
      const template =
        "{% for m in messages %}{{ bos_token }}{{ m.role }}: {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}" +
        "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}";
      const config = { bos_token: "<s>", eos_token: "</s>", chat_template: template };
      files.push(new File([JSON.stringify(config)], "tokenizer_config.json"));
      const model = await wt.Model.fromFiles(dev, files);
      const messages = [{ role: "user", content: "In the beginning" }];
      const first = await model.chat(messages, { maxTokens: 6 });
      messages.push({ role: "assistant", content: first.text }, { role: "user", content: "And God said" });
      const second = await model.chat(messages, { maxTokens: 6 });
      model.clearCache();
      const again = await model.chat(messages, { maxTokens: 6 });
      const builtin = await wt.Model.builtin(dev);
      return {
        template: model.chatTemplate,
        builtinTemplate: builtin.chatTemplate ?? null,
        first: first.promptTokens,
        second: second.promptTokens,
        firstReused: first.promptTokensReused,
        secondReused: second.promptTokensReused,
        secondText: second.text,
        again: [again.promptTokensReused, again.text],
        // Without a template of its own the model renders ChatML: the prompt of that text
        // given to generate, less the BOS token generate puts first (a chat template writes
        // its own, and ChatML writes none).
        chatml: (await builtin.chat([{ role: "user", content: "In the beginning" }], { maxTokens: 1 })).promptTokens,
        chatmlText: (await builtin.generate("<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\n", { maxTokens: 1 })).promptTokens,
        plainText: (await builtin.generate("In the beginning", { maxTokens: 1 })).promptTokens,
        badMessages: await rejected(model.chat([{ role: "user" }])),
      };
    });
    assert.match(r.template, /add_generation_prompt/);
    assert.equal(r.builtinTemplate, null);
    // "<s>user: In the beginning</s>\n<s>assistant:" is 21 tokens for Hugging Face tokenizers.
    assert.equal(r.first, 21);
    assert.ok(r.second > r.first, `${r.second}`);
    // The second turn runs only what follows the first's prompt and reply; after clearCache
    // the same turn runs whole, and draws the same reply.
    assert.equal(r.firstReused, 0);
    assert.ok(r.secondReused >= r.first, `${r.secondReused} of ${r.second} kept`);
    assert.deepEqual(r.again, [0, r.secondText]);
    assert.equal(r.chatml + 1, r.chatmlText);
    assert.ok(r.chatml > r.plainText, `${r.chatml} ≤ ${r.plainText}`);
    assert.match(r.badMessages, /messages/);
  });
});

/// Loads the demo, waits for the built-in model, generates, and returns the page's text.
async function generateOnDemo(page, query, maxTokens) {
  await page.goto(`${server.url}${query}`);
  await page.waitForSelector("body[data-state=ready]", { timeout: 180_000 });
  await page.fill("#max-tokens", String(maxTokens));
  await page.click("#generate");
  await page.waitForSelector("body[data-state=done]", { timeout: 180_000 });
  return {
    status: await page.textContent("#backend-status"),
    output: await page.textContent("#output"),
    stats: await page.textContent("#gen-stats"),
    prompt: await page.inputValue("#prompt"),
  };
}

test("the demo generates with the built-in model on WebGPU and can be stopped", { timeout: 400_000 }, async (t) => {
  await withBrowser({ webgpu: true }, async (browser) => {
    if (await webgpuReason(browser.page, t)) return;
    const { page } = browser;
    const r = await generateOnDemo(page, "?backend=wgpu", 40);
    t.diagnostic(`${r.status} | ${r.stats}`);
    assert.match(r.status, /Backend: wgpu/);
    assert.ok(r.output.startsWith(r.prompt) && r.output.length > r.prompt.length + 20, `output: ${r.output}`);
    assert.match(r.stats, /\d+ tokens · [\d.]+ tokens\/s on wgpu/);
    await page.screenshot({ path: path.join(ARTIFACTS, "demo.png"), fullPage: true });

    // Stop: a long generation ends early when the button is pressed.
    await page.fill("#max-tokens", "1000");
    await page.click("#generate");
    await page.waitForFunction(() => /tokens/.test(document.getElementById("gen-stats").textContent));
    await page.click("#stop");
    await page.waitForSelector("body[data-state=done]", { timeout: 120_000 });
    assert.match(await page.textContent("#gen-stats"), /\(stopped\)/);
  });
});

// 200 tokens: a cache of about 204 columns, past the 64 where attention on a CPU adapter
// splits each query's keys into chunks (six here) merged by a second kernel, compiled by
// Chromium's own shader compiler (Tint, not the naga of the native tests); each decode step
// after the first is a replay of the first with more keys.
test("a long greedy generation on WebGPU (attention split over its keys) gives the cpu backend's text", { timeout: 300_000 }, async (t) => {
  await withBrowser({ webgpu: true }, async (browser) => {
    if (await webgpuReason(browser.page, t)) return;
    const r = await browser.page.evaluate(async () => {
      const wt = await import("/pkg/webtensor.js");
      await wt.default();
      const out = {};
      for (const backend of ["wgpu", "cpu"]) {
        const model = await wt.Model.builtin(await wt.createDevice(backend));
        const s = await model.generate("And God said", { maxTokens: 200, temperature: 0 });
        out[backend] = { text: s.text, generated: s.generatedTokens };
      }
      return out;
    });
    assert.equal(r.wgpu.generated, 200);
    assert.equal(r.wgpu.text, r.cpu.text);
  });
});

test("without WebGPU the demo says it fell back to cpu and still generates", { timeout: 300_000 }, async (t) => {
  await withBrowser({ webgpu: false }, async (browser) => {
    const r = await generateOnDemo(browser.page, "", 30);
    t.diagnostic(`${r.status} | ${r.stats}`);
    assert.match(r.status, /WebGPU is not available, so this page fell back to the cpu backend/);
    assert.match(await browser.page.textContent("#backend-note"), /Why: /);
    assert.ok(r.output.length > r.prompt.length + 10, `output: ${r.output}`);
    assert.match(r.stats, /on cpu/);
    await browser.page.screenshot({ path: path.join(ARTIFACTS, "demo-fallback.png"), fullPage: true });
  });
});

test("the benchmark tab times ops on WebGPU and cpu and downloads the report", { timeout: 600_000 }, async (t) => {
  await withBrowser({ webgpu: true }, async (browser) => {
    if (await webgpuReason(browser.page, t)) return;
    const { page } = browser;
    await page.goto(`${server.url}?backend=wgpu`);
    await page.waitForSelector("body[data-state=ready]", { timeout: 180_000 });
    await page.click("button[data-tab=bench]");
    await page.fill("#bench-ops", process.env.WEBTENSOR_BROWSER_BENCH_OPS || "add,rms_norm,softmax,matmul");
    await page.fill("#bench-runs", "3");
    await page.click("#bench-run");
    await page.waitForSelector("body[data-bench=done]", { timeout: 540_000 });
    const [download] = await Promise.all([page.waitForEvent("download"), page.click("#bench-download")]);
    const file = path.join(ARTIFACTS, "bench-browser.json");
    await download.saveAs(file);
    const report = await page.evaluate(() => window.benchReport);
    writeFileSync(file, JSON.stringify(report, null, 2));
    assert.equal(report.schema_version, 3);
    assert.deepEqual(report.backends.map((b) => b.info.kind), ["wgpu", "cpu"]);
    for (const row of report.rows) {
      assert.ok(row.checked && row.median_us > 0, `${row.op} ${row.case} on ${row.backend}: ${row.error}`);
    }
    assert.equal(await page.locator("#bench-chart svg rect").count(), report.rows.length);
    await page.screenshot({ path: path.join(ARTIFACTS, "bench.png"), fullPage: true });
  });
});
