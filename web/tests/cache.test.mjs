// Models fetched by URL are kept in Cache Storage (a second visit does not download, counted
// from the page's requests), listed with their sizes and deleted; and the WebGPU adapter is
// named from the browser's GPUAdapterInfo (wgpu leaves the name empty there). Run by
// scripts/test.sh after web/build.sh.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, statSync } from "node:fs";
import path from "node:path";
import { IN_CI, ROOT, withBrowser, startServer } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

const FIXTURE = path.join(ROOT, "native-tests/fixtures/gguf/llama31.q8_0.gguf");

test("a model fetched by URL is cached: the second visit loads it without a download", { timeout: 300_000 }, async () => {
  await withBrowser({ webgpu: false }, async (browser) => {
    const { page } = browser;
    // Whole-file requests (downloads), apart from the Range requests that size a model first.
    let downloads = 0;
    let headers = 0;
    await page.route("**/tests/models/tiny.gguf", (route) => {
      if (route.request().headers().range) headers += 1;
      else downloads += 1;
      return route.fulfill({ status: 200, contentType: "application/octet-stream", body: readFileSync(FIXTURE) });
    });
    const load = () =>
      page.evaluate(async () => {
        const wt = await import("/pkg/webtensor.js");
        await wt.default();
        const dev = await wt.createDevice("cpu");
        const phases = new Set();
        const model = await wt.Model.fromUrl(dev, "/tests/models/tiny.gguf", (phase) => phases.add(phase));
        const stats = await model.generate("a", { maxTokens: 4 });
        return { phases: [...phases].sort(), text: stats.text, cached: await wt.cachedModels() };
      });
    await page.goto(`${server.url}tests/blank.html`);
    const first = await load();
    assert.equal(downloads, 1);
    assert.equal(headers, 1, "the model was not sized before the download");
    assert.deepEqual(first.phases, ["download", "parse", "upload"]);
    assert.equal(first.cached.length, 1);
    assert.match(first.cached[0].url, /\/tests\/models\/tiny\.gguf$/);
    assert.equal(first.cached[0].bytes, statSync(FIXTURE).size);

    // A second visit: from the cache, no request.
    await page.reload();
    const second = await load();
    assert.equal(downloads, 1, "the second visit downloaded the model again");
    assert.equal(headers, 1);
    assert.deepEqual(second.phases, ["cache", "parse", "upload"]);
    assert.equal(second.text, first.text);

    // Deleted: the next load downloads again.
    const deleted = await page.evaluate(async (url) => {
      const wt = await import("/pkg/webtensor.js");
      return { removed: await wt.deleteCachedModel(url), again: await wt.deleteCachedModel(url), left: await wt.cachedModels() };
    }, first.cached[0].url);
    assert.deepEqual(deleted, { removed: true, again: false, left: [] });
    const third = await load();
    assert.equal(downloads, 2);
    assert.deepEqual(third.phases, ["download", "parse", "upload"]);

    // A download that is not a model is not kept.
    const notModel = await page.evaluate(async () => {
      const wt = await import("/pkg/webtensor.js");
      const dev = await wt.createDevice("cpu");
      const error = await wt.Model.fromUrl(dev, "/tests/tiny-kjv/config.json").then(() => "resolved", (e) => e.message);
      return { error, cached: (await wt.cachedModels()).map((m) => m.url) };
    });
    assert.match(notModel.error, /config\.json/);
    assert.deepEqual(notModel.cached.filter((u) => u.endsWith("config.json")), []);
  });
});

/// A GGUF header (version 3, no metadata) declaring one f32 tensor of `shape` (row-major).
function ggufHeader(name, shape) {
  const parts = [];
  const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); parts.push(b); };
  const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); parts.push(b); };
  parts.push(Buffer.from("GGUF"));
  u32(3);
  u64(1);
  u64(0);
  u64(name.length);
  parts.push(Buffer.from(name));
  u32(shape.length);
  for (const d of [...shape].reverse()) u64(d);
  u32(0);
  u64(0);
  const header = Buffer.concat(parts);
  const padded = Buffer.concat([header, Buffer.alloc((32 - (header.length % 32)) % 32)]);
  return { bytes: padded, fileLen: padded.length + shape.reduce((a, b) => a * b, 1) * 4 };
}

test("a model too large for the page is refused with a typed error before its download", { timeout: 300_000 }, async () => {
  await withBrowser({ webgpu: false }, async (browser) => {
    const { page } = browser;
    // A 2.7 GB embedding table (5.4 GB of page memory on the cpu backend, beyond wasm32's
    // 4 GiB): its header alone, answered to the Range request, with the
    // whole file's size in Content-Range; any other request is a download.
    const huge = ggufHeader("token_embd.weight", [131072, 5120]);
    let downloads = 0;
    await page.route("**/tests/models/huge.gguf", (route) => {
      if (!route.request().headers().range) {
        downloads += 1;
        return route.fulfill({ status: 500, body: "" });
      }
      return route.fulfill({
        status: 206,
        contentType: "application/octet-stream",
        headers: { "Content-Range": `bytes 0-${huge.bytes.length - 1}/${huge.fileLen}` },
        body: huge.bytes,
      });
    });
    await page.route("**/tests/models/tiny.gguf", (route) => route.fulfill({ status: 200, body: readFileSync(FIXTURE) }));
    await page.goto(`${server.url}tests/blank.html`);
    const r = await page.evaluate(async () => {
      const wt = await import("/pkg/webtensor.js");
      await wt.default();
      const dev = await wt.createDevice("cpu");
      const tiny = await wt.estimateModel(dev, "/tests/models/tiny.gguf");
      const refused = await wt.Model.fromUrl(dev, "/tests/models/huge.gguf").then(
        () => null,
        (e) => ({ name: e.name, message: e.message, estimate: e.estimate }),
      );
      return { tiny, refused };
    });
    assert.equal(r.tiny.fits, true, r.tiny.reason);
    assert.equal(r.tiny.fileBytes, statSync(FIXTURE).size);
    assert.ok(r.tiny.deviceBytes > 0 && r.tiny.largestTensor, JSON.stringify(r.tiny));
    assert.ok(r.refused, "the huge model loaded");
    assert.equal(r.refused.name, "ModelTooLargeError", r.refused.message);
    assert.match(r.refused.message, /page memory/);
    assert.equal(r.refused.estimate.fits, false);
    assert.equal(r.refused.estimate.fileBytes, huge.fileLen);
    assert.equal(r.refused.estimate.largestTensor, "token_embd.weight");
    assert.equal(r.refused.estimate.largestTensorBytes, 131072 * 5120 * 4);
    assert.equal(downloads, 0, "the model was downloaded before it was refused");
  });
});

test("the WebGPU adapter is named from the browser's GPUAdapterInfo", { timeout: 300_000 }, async (t) => {
  await withBrowser({ webgpu: true }, async (browser) => {
    const { page } = browser;
    await page.goto(`${server.url}tests/blank.html`);
    const r = await page.evaluate(async () => {
      const wt = await import("/pkg/webtensor.js");
      await wt.default();
      const reason = await wt.webgpuUnavailableReason();
      if (reason) return { reason };
      const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
      const gpu = { vendor: adapter.info.vendor, architecture: adapter.info.architecture, device: adapter.info.device, description: adapter.info.description };
      const dev = await wt.createDevice("wgpu");
      const auto = await wt.createDevice();
      const report = await wt.runBenchmarks({ backends: ["wgpu"], ops: ["add"], runs: 1, minSampleSecs: 0.001 });
      return {
        gpu,
        name: dev.info().info.device_name,
        reasons: auto.info().decisions.map((d) => d.reason),
        benchName: report.backends[0].info.device_name,
        rowDevice: report.rows[0].device,
      };
    });
    if (r.reason && IN_CI) assert.fail(`CI needs a WebGPU adapter (SwiftShader): ${r.reason}`);
    if (r.reason) return t.skip(`no WebGPU adapter: ${r.reason}`);
    t.diagnostic(`GPUAdapterInfo ${JSON.stringify(r.gpu)} -> device_name "${r.name}"`);
    const expected = r.gpu.description || [r.gpu.vendor, r.gpu.architecture, r.gpu.device].filter(Boolean).join(" ");
    assert.ok(expected, "the browser tells nothing about its adapter");
    assert.equal(r.name, expected);
    assert.equal(r.benchName, expected);
    assert.equal(r.rowDevice, expected);
    for (const reason of r.reasons) assert.doesNotMatch(reason, /\( is|\(\)/, reason);
  });
});
