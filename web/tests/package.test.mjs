// The npm package as a user gets it: `npm pack` of web/pkg, installed from the tarball into a
// throwaway Vite app, built with Vite and served by `vite preview`, then opened in headless
// Chromium, where the page runs an op and generates with the built-in model through the
// package's own import path ("webtensor"). Run by scripts/test.sh after web/build.sh.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { build, preview } from "vite";
import { ROOT, launch } from "./harness.mjs";

const PKG = path.join(ROOT, "web/pkg");

/// The page of the throwaway app: imports the package by name, as the package's README shows.
const MAIN_JS = `
import init, { createDevice, opSilu, Model, version } from "webtensor";
async function run() {
  await init();
  const device = await createDevice("cpu");
  const x = device.tensor(new Float32Array([1, -2, 3, 0.5]), [1, 4]);
  const silu = Array.from(await opSilu(x).toArray());
  const model = await Model.builtin(device);
  const stats = await model.generate("And God said", { maxTokens: 8 });
  return { version: version(), silu, generated: stats.generatedTokens, text: stats.text };
}
run().then(
  (r) => { document.body.dataset.result = JSON.stringify(r); },
  (e) => { document.body.dataset.result = JSON.stringify({ error: String(e && e.stack || e) }); },
);
`;

test("npm pack of web/pkg installs into a Vite app that builds and runs in Chromium", { timeout: 300_000 }, async (t) => {
  const work = mkdtempSync(path.join(tmpdir(), "webtensor-vite-"));
  let server;
  let browser;
  try {
    // The tarball, and what it holds.
    const [packed] = JSON.parse(execFileSync("npm", ["pack", "--json", "--pack-destination", work], { cwd: PKG, encoding: "utf8" }));
    const files = packed.files.map((f) => f.path).sort();
    t.diagnostic(`${packed.filename}: ${files.join(", ")} (${(packed.size / 1e6).toFixed(1)} MB)`);
    for (const f of ["package.json", "webtensor.js", "webtensor.d.ts", "webtensor_bg.wasm", "README.md", "load.js", "threads/webtensor.js", "threads/webtensor_bg.wasm"]) {
      assert.ok(files.includes(f), `the tarball lacks ${f}`);
    }
    const manifest = JSON.parse(readFileSync(path.join(PKG, "package.json"), "utf8"));
    assert.equal(manifest.name, "webtensor");
    assert.match(manifest.version, /^\d+\.\d+\.\d+/);
    assert.equal(manifest.version, version(), "package.json's version is the crate's");

    // A plain Vite app that depends on the tarball.
    const app = path.join(work, "app");
    mkdirSync(app);
    writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "vite-app", private: true, type: "module", dependencies: { webtensor: `file:../${packed.filename}` } }));
    writeFileSync(path.join(app, "index.html"), `<!doctype html><html><head><meta charset="utf-8"><title>app</title><script type="module" src="/main.js"></script></head><body></body></html>`);
    writeFileSync(path.join(app, "main.js"), MAIN_JS);
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error"], { cwd: app, stdio: "inherit" });

    const isolation = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp" };
    await build({ root: app, logLevel: "warn", build: { outDir: path.join(app, "dist") } });
    server = await preview({ root: app, logLevel: "warn", build: { outDir: path.join(app, "dist") }, preview: { port: 0, host: "127.0.0.1", headers: isolation } });
    const url = server.resolvedUrls.local[0];

    browser = await launch({ webgpu: false });
    await browser.page.goto(url);
    await browser.page.waitForSelector("body[data-result]", { state: "attached", timeout: 120_000 });
    const r = JSON.parse(await browser.page.getAttribute("body", "data-result"));
    assert.equal(r.error, undefined, `${r.error}\n${browser.logs.join("\n")}`);
    t.diagnostic(`webtensor ${r.version}: silu ${r.silu.map((v) => v.toFixed(4)).join(" ")}; "${r.text}"`);
    const expected = [1, -2, 3, 0.5].map((v) => v / (1 + Math.exp(-v)));
    r.silu.forEach((v, i) => assert.ok(Math.abs(v - expected[i]) < 1e-5, `silu[${i}] = ${v}, expected ${expected[i]}`));
    assert.equal(r.generated, 8);
    assert.ok(r.text.length > 8, `generated text: ${JSON.stringify(r.text)}`);
  } finally {
    await browser?.close();
    await server?.close();
    rmSync(work, { recursive: true, force: true });
  }
});

/// webtensor-web's version from web/Cargo.toml.
function version() {
  return readFileSync(path.join(ROOT, "web/Cargo.toml"), "utf8").match(/^version = "([^"]+)"/m)[1];
}
