// The Chromium speed comparison of issues 12 and 13 (run it through scripts/browser_bench.sh):
// one GGUF in one headless, cross-origin isolated Chromium page with WebGPU (SwiftShader without
// a GPU), generated greedily by
//   - webtensor on its wgpu backend (WebGPU), on the page,
//   - webtensor on its cpu backend (wasm simd128) at N threads, in a createWorkerModel worker:
//     N = 1 loads the one-thread build, N > 1 the threaded build (web/pkg/threads, a pool of N
//     Web Workers),
//   - wllama (llama.cpp in wasm, @wllama/wllama from npm) at N threads (its own worker), with
//     whatever backend it picks (its log says whether its WebGPU path engaged), or with
//     n_gpu_layers 0 (wllama-cpu).
// A path is a name with an optional thread count: cpu:2, wllama:2 (1 when absent).
// Every path is loaded once and warmed up with one short generation (shader compilation, JIT),
// then the paths take turns, run after run, so that a change in the machine's load hits all of
// them alike. Prints min / median / max of prompt and decode tokens per second as Markdown,
// and for webtensor's paths the gaps between tokens reaching the page (each token's onToken
// call timed: the run's median gap and its largest).
//
// Settings (environment): BENCH_MODEL (the GGUF), BENCH_RUNS (≥ 3), BENCH_TOKENS (tokens
// generated per run), BENCH_PROMPT_WORDS (prompt length), BENCH_PATHS (comma-separated paths
// of wgpu, cpu[:N], wllama[:N], wllama-cpu[:N]), BENCH_TIMEOUT_S (the longest one generation
// may take before the bench gives up, printing the page's last log lines), BENCH_JSON (also
// write the figures there), BENCH_CHROMIUM_FLAGS (space-separated switches added to the
// browser's, for diagnosis: `--enable-dawn-features=disable_robustness` shows what Dawn's
// bounds checks cost the wgpu path; the table then names them, since no user's browser runs
// that way).
// A benchmark, not a test: nothing here asserts a speed.
import { readFileSync, statSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { launch, startServer } from "../tests/harness.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const env = process.env;
const MODEL = path.resolve(env.BENCH_MODEL || path.join(HERE, "../../target/models/smollm-q4_0.gguf"));
const RUNS = Number(env.BENCH_RUNS || 3);
const TOKENS = Number(env.BENCH_TOKENS || 8);
const PROMPT_WORDS = Number(env.BENCH_PROMPT_WORDS || 16);
// webtensor's cpu backend and wllama, each at 1 and 2 threads.
const PATHS = (env.BENCH_PATHS || "cpu:1,wllama:1,cpu:2,wllama:2").split(",").map((s) => s.trim()).filter(Boolean);
const TIMEOUT_S = Number(env.BENCH_TIMEOUT_S || 900);
const KNOWN = ["wgpu", "cpu", "wllama", "wllama-cpu"];
const EXTRA_FLAGS = (env.BENCH_CHROMIUM_FLAGS || "").split(" ").filter(Boolean);
const badFlag = EXTRA_FLAGS.find((f) => !f.startsWith("--"));
if (badFlag) throw new Error(`BENCH_CHROMIUM_FLAGS: "${badFlag}" is not a switch (each starts with --)`);

/// A path's name and thread count ("cpu:2" → { kind: "cpu", threads: 2 }).
function parsePath(p) {
  const [kind, n = "1"] = p.split(":");
  const threads = Number(n);
  if (!KNOWN.includes(kind)) throw new Error(`BENCH_PATHS: unknown path "${p}" (known: ${KNOWN.join(", ")}, with :N threads)`);
  if (!Number.isInteger(threads) || threads < 1 || (kind === "wgpu" && threads !== 1)) {
    throw new Error(`BENCH_PATHS: "${p}" has a bad thread count (a whole number ≥ 1; wgpu takes none)`);
  }
  return { kind, threads };
}
const SPECS = Object.fromEntries(PATHS.map((p) => [p, parsePath(p)]));
if (!(RUNS >= 3)) throw new Error("BENCH_RUNS must be at least 3 (min/median/max of alternating runs)");
if (!(TOKENS >= 2)) throw new Error("BENCH_TOKENS must be at least 2 (decode speed is measured after the first token)");
statSync(MODEL); // a missing model fails here, naming the path

const WLLAMA_DIR = path.join(HERE, "node_modules/@wllama/wllama");
const WLLAMA_VERSION = JSON.parse(readFileSync(path.join(WLLAMA_DIR, "package.json"), "utf8")).version;
const ISOLATION = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
  "Cross-Origin-Resource-Policy": "same-origin",
};
const TYPES = { ".js": "text/javascript", ".wasm": "application/wasm", ".gguf": "application/octet-stream" };

// The same words for every path; each path's tokenizer reads the same GGUF vocabulary.
const WORDS = "the quick brown fox jumps over the lazy dog while a small model reads every word of this sentence".split(" ");
const PROMPT = Array.from({ length: PROMPT_WORDS }, (_, i) => WORDS[i % WORDS.length]).join(" ");

function stats(values) {
  const v = [...values].sort((a, b) => a - b);
  return { min: v[0], median: v[Math.floor(v.length / 2)], max: v[v.length - 1] };
}

const fmt = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x >= 1 ? x.toFixed(2) : x.toPrecision(2));
const cell = (s) => `${fmt(s.min)} / ${fmt(s.median)} / ${fmt(s.max)}`;

const server = await startServer();
const browser = await launch({ webgpu: true, extraFlags: EXTRA_FLAGS });
const { page } = browser;
try {
  // The model and wllama's files, same-origin and isolated (wllama's threads need
  // SharedArrayBuffer), from this checkout.
  await page.route("**/bench/**", (route) => {
    const name = new URL(route.request().url()).pathname.replace(/^\/bench\//, "");
    let file = null;
    if (name === "model.gguf") file = MODEL;
    const m = name.match(/^wllama\/(esm\/[\w/.-]+\.(?:js|wasm))$/);
    if (m && !m[1].includes("..")) file = path.join(WLLAMA_DIR, m[1]);
    if (!file) return route.fulfill({ status: 404, body: "" });
    const type = TYPES[path.extname(file)] || "application/octet-stream";
    return route.fulfill({ status: 200, contentType: type, headers: ISOLATION, path: file });
  });
  await page.goto(`${server.url}tests/blank.html`);

  const setup = await page.evaluate(
    async ({ paths, specs }) => {
      const wt = await import("/pkg/webtensor.js");
      await wt.default();
      const g = (globalThis.bench = { models: {}, wllama: {}, logs: [] });
      const out = { isolated: globalThis.crossOriginIsolated, cores: navigator.hardwareConcurrency, paths: {} };
      const blob = await (await fetch("/bench/model.gguf")).blob();
      const describe = (i) =>
        [i.device_name, i.driver, i.api, `features: ${i.features.join(" ") || "none"}`, i.reductions, i.threads && `${i.threads} thread(s)`]
          .filter(Boolean)
          .join("; ");
      for (const p of paths) {
        const { kind, threads } = specs[p];
        const t0 = performance.now();
        if (kind === "wgpu") {
          const reason = await wt.webgpuUnavailableReason();
          if (reason) throw new Error(`no WebGPU adapter: ${reason}`);
          const dev = await wt.createDevice(kind);
          if (dev.backend !== kind) throw new Error(`asked for ${kind}, got ${dev.backend}`);
          g.models[p] = await wt.Model.fromUrl(dev, "/bench/model.gguf");
          out.paths[p] = { loadSecs: (performance.now() - t0) / 1000, info: describe(dev.info().info) };
        } else if (kind === "cpu") {
          // In a worker, as wllama runs in its own: the threaded build's calling thread then
          // waits for its pool instead of spinning on the page's thread.
          const m = await wt.createWorkerModel({ backend: "cpu", threads, source: { url: "/bench/model.gguf" } });
          const i = m.deviceInfo.info;
          if (m.backend !== "cpu" || i.threads !== threads) {
            throw new Error(`${p}: asked for cpu on ${threads} thread(s), got ${m.backend} on ${i.threads}`);
          }
          g.models[p] = m;
          out.paths[p] = { loadSecs: (performance.now() - t0) / 1000, info: describe(i) };
        } else {
          const { Wllama } = await import("/bench/wllama/esm/index.js");
          const lines = g.logs;
          const keep = (level) => (...a) => lines.push(`${p} ${level}: ${a.join(" ")}`);
          const logger = { debug: keep("debug"), log: keep("log"), warn: keep("warn"), error: keep("error") };
          const w = new Wllama({ default: "/bench/wllama/esm/wasm/wllama.wasm" }, { logger });
          const params = { n_ctx: 512, n_threads: threads };
          if (kind === "wllama-cpu") params.n_gpu_layers = 0;
          await w.loadModel([blob], params);
          g.wllama[p] = w;
          // What llama.cpp said about devices and offloading: whether WebGPU engaged.
          const device = lines.filter((l) => l.startsWith(`${p} `) && /webgpu|offload|device|buffer size/i.test(l)).slice(0, 12);
          out.paths[p] = {
            loadSecs: (performance.now() - t0) / 1000,
            threads: w.getNumThreads(),
            multithread: w.isMultithread(),
            webgpuInBrowser: w.isSupportWebGPU(),
            device,
          };
        }
      }
      return out;
    },
    { paths: PATHS, specs: SPECS },
  );

  // One generation on path `p`: prompt and decode tokens per second as the path itself
  // measures them (webtensor: prompt through the first token, then the tokens after it;
  // llama.cpp: its prompt and predicted timings), plus the wall time around the call.
  const generate = (p, maxTokens) => {
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(async () => {
        const tail = await page.evaluate(() => globalThis.bench.logs.slice(-30)).catch(() => []);
        reject(new Error(`${p}: one generation took over ${TIMEOUT_S} s (BENCH_TIMEOUT_S); last log lines:\n${tail.join("\n")}`));
      }, TIMEOUT_S * 1000);
    });
    const run = page.evaluate(
      async ({ p, prompt, maxTokens }) => {
        const g = globalThis.bench;
        const t0 = performance.now();
        if (g.models[p]) {
          // When each token's piece reaches the page (onToken is called for every token).
          const arrivals = [];
          // Each run times the whole prompt, not what the last run kept of it.
          g.models[p].clearCache();
          const s = await g.models[p].generate(prompt, { maxTokens, temperature: 0 }, () => arrivals.push(performance.now()));
          const gaps = arrivals.slice(1).map((t, i) => t - arrivals[i]).sort((a, b) => a - b);
          return {
            promptTokens: s.promptTokens,
            generated: s.generatedTokens,
            prompt: s.promptTokens / s.promptSecs,
            decode: s.tokensPerSec,
            gapMedianMs: gaps.length ? gaps[Math.floor(gaps.length / 2)] : null,
            gapMaxMs: gaps.length ? gaps[gaps.length - 1] : null,
            wallSecs: (performance.now() - t0) / 1000,
          };
        }
        const r = await g.wllama[p].createCompletion({
          prompt,
          max_tokens: maxTokens,
          temperature: 0,
          ignore_eos: true,
          cache_prompt: false,
        });
        const t = r.timings;
        if (!t) throw new Error("wllama returned no timings");
        return {
          promptTokens: t.prompt_n,
          generated: r.usage?.completion_tokens ?? t.predicted_n,
          prompt: t.prompt_per_second,
          decode: t.predicted_per_second,
          wallSecs: (performance.now() - t0) / 1000,
        };
      },
      { p, prompt: PROMPT, maxTokens },
    );
    return Promise.race([run, late]).finally(() => clearTimeout(timer));
  };

  console.error(`browser_bench: ${MODEL} · ${RUNS} runs of ${TOKENS} tokens after a ${PROMPT_WORDS}-word prompt`);
  for (const p of PATHS) {
    const s = setup.paths[p];
    console.error(`browser_bench: ${p} loaded in ${s.loadSecs.toFixed(1)} s; warming up`);
    if (s.device) {
      console.error(`browser_bench: ${p}: ${s.threads} thread(s), WebGPU in the page: ${s.webgpuInBrowser}; llama.cpp says:`);
      for (const line of s.device) console.error(`    ${line}`);
    }
    await generate(p, 2);
  }
  const runs = Object.fromEntries(PATHS.map((p) => [p, []]));
  for (let r = 0; r < RUNS; r++) {
    for (const p of PATHS) {
      const x = await generate(p, TOKENS);
      runs[p].push(x);
      const gaps = x.gapMedianMs == null ? "" : `, token gaps median ${x.gapMedianMs.toFixed(0)} ms, max ${x.gapMaxMs.toFixed(0)} ms`;
      console.error(`browser_bench: run ${r + 1}/${RUNS} ${p}: prompt ${fmt(x.prompt)} tok/s (${x.promptTokens} tokens), decode ${fmt(x.decode)} tok/s (${x.generated} tokens)${gaps}, ${x.wallSecs.toFixed(1)} s`);
    }
  }

  const label = {
    wgpu: "webtensor wgpu (WebGPU)",
    cpu: "webtensor cpu (wasm simd128)",
    wllama: `wllama ${WLLAMA_VERSION} (default backend)`,
    "wllama-cpu": `wllama ${WLLAMA_VERSION} (n_gpu_layers 0)`,
  };
  const cpuPath = PATHS.find((p) => SPECS[p].kind === "cpu");
  const lines = [
    `Headless Chromium; webtensor's WebGPU adapter: ${setup.paths.wgpu?.info ?? "(wgpu path not run)"}.`,
    `crossOriginIsolated ${setup.isolated}; ${setup.cores} cores; webtensor cpu: ${setup.paths[cpuPath]?.info ?? "(not run)"}.`,
    `Model ${path.basename(MODEL)}; greedy; ${TOKENS} tokens after a ${runs[PATHS[0]][0].promptTokens}-token prompt; ${RUNS} alternating runs, min / median / max tokens/s.`,
    ...(EXTRA_FLAGS.length ? ["", `A diagnostic run: Chromium started with ${EXTRA_FLAGS.join(" ")} as well.`] : []),
    "",
    "Token gaps: the time between two tokens' pieces reaching the page (webtensor's onToken), the run's median and its largest, in ms.",
    "",
    "| path | decode tok/s | prompt tok/s | token gap, median ms | token gap, max ms |",
    "| --- | --- | --- | --- | --- |",
  ];
  const result = { model: MODEL, runs: RUNS, tokens: TOKENS, chromiumFlags: EXTRA_FLAGS, setup, paths: {} };
  for (const p of PATHS) {
    const d = stats(runs[p].map((x) => x.decode));
    const q = stats(runs[p].map((x) => x.prompt));
    const timed = runs[p].every((x) => x.gapMedianMs != null);
    const gm = timed ? stats(runs[p].map((x) => x.gapMedianMs)) : null;
    const gx = timed ? stats(runs[p].map((x) => x.gapMaxMs)) : null;
    result.paths[p] = { decode: d, prompt: q, gapMedianMs: gm, gapMaxMs: gx, runs: runs[p] };
    const { kind, threads } = SPECS[p];
    const s = setup.paths[p];
    const how = kind.startsWith("wllama") ? `, ${s.threads} thread(s)${s.multithread ? "" : " (not multithreaded)"}` : kind === "cpu" ? `, ${threads} thread(s)` : "";
    const ms = (s) => (s ? `${s.min.toFixed(0)} / ${s.median.toFixed(0)} / ${s.max.toFixed(0)}` : "—");
    lines.push(`| ${label[kind]}${how} | ${cell(d)} | ${cell(q)} | ${ms(gm)} | ${ms(gx)} |`);
  }
  for (const p of PATHS.filter((p) => SPECS[p].kind.startsWith("wllama"))) {
    lines.push("", `${p}: llama.cpp's device lines:`, ...setup.paths[p].device.map((l) => `    ${l}`));
  }
  // Run-by-run decode ratios of webtensor cpu to wllama at the same thread count.
  for (const p of PATHS.filter((p) => SPECS[p].kind === "cpu")) {
    const peer = PATHS.find((q) => SPECS[q].kind.startsWith("wllama") && SPECS[q].threads === SPECS[p].threads);
    if (!peer) continue;
    const ratio = stats(runs[p].map((x, i) => x.decode / runs[peer][i].decode));
    lines.push("", `${p} decode ÷ ${peer} decode, run by run: ${cell(ratio)}`);
  }
  if (runs.wgpu && runs["cpu:1"]) {
    const ratio = stats(runs.wgpu.map((x, i) => x.decode / runs["cpu:1"][i].decode));
    const prompt = stats(runs.wgpu.map((x, i) => x.prompt / runs["cpu:1"][i].prompt));
    lines.push("", `webtensor wgpu ÷ cpu:1, run by run: decode ${cell(ratio)}, prompt ${cell(prompt)}`);
  }
  console.log(lines.join("\n"));
  if (env.BENCH_JSON) writeFileSync(env.BENCH_JSON, JSON.stringify(result, null, 2));
} catch (e) {
  console.error(browser.logs.join("\n"));
  throw e;
} finally {
  await browser.close();
  server.stop();
}
