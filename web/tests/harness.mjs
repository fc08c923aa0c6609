// Shared pieces of the browser tests: the demo server (`webtensor serve`), headless Chromium
// with or without WebGPU (SwiftShader), and the artifacts folder.
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const ARTIFACTS = path.join(ROOT, "target/browser-artifacts");
mkdirSync(ARTIFACTS, { recursive: true });

/// In CI (and under scripts/test.sh) a missing WebGPU adapter fails the tests instead of
/// skipping them.
export const IN_CI = process.env.CI === "true" || process.env.WEBTENSOR_REQUIRE_WGPU === "1";

/// Real WebGPU in headless Chromium without a GPU: Vulkan through SwiftShader (DESIGN.md).
const WEBGPU_FLAGS = [
  "--enable-unsafe-webgpu",
  "--enable-features=Vulkan",
  "--use-vulkan=swiftshader",
  "--use-webgpu-adapter=swiftshader",
];
const COMMON_FLAGS = [
  "--no-sandbox",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];

/// Starts `webtensor serve --port 0` on this checkout and resolves with its base URL.
export function startServer() {
  const bin = process.env.WEBTENSOR_BIN || path.join(ROOT, "target/debug/webtensor");
  const child = spawn(bin, ["serve", "--port", "0", "--dir", ROOT], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    child.on("error", reject);
    child.on("exit", (code) => reject(new Error(`webtensor serve exited with ${code}: ${out}`)));
    child.stdout.on("data", (chunk) => {
      out += chunk;
      const m = out.match(/http:\/\/127\.0\.0\.1:\d+\//);
      if (m) resolve({ url: m[0], stop: () => child.kill() });
    });
  });
}

/// Headless Chromium (Debian's, /usr/bin/chromium) with a fresh profile; `webgpu: false`
/// launches it with WebGPU turned off, to test the cpu fallback. `extraFlags` are switches
/// added after the rest (the bench's diagnostic runs).
export async function launch({ webgpu, extraFlags = [] }) {
  const profile = mkdtempSync(path.join(tmpdir(), "webtensor-chromium-"));
  const args = [...COMMON_FLAGS, ...(webgpu ? WEBGPU_FLAGS : ["--disable-features=WebGPU"]), ...extraFlags];
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args,
    viewport: { width: 1000, height: 900 },
    acceptDownloads: true,
  });
  const page = context.pages()[0] ?? (await context.newPage());
  const logs = [];
  page.on("console", (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => logs.push(`pageerror: ${e.message}`));
  // The test modules (web/tests/*.js) and a blank page, same-origin and isolated like the demo
  // (blank.html), or not isolated (plain.html).
  await page.route("**/tests/**", (route) => {
    const name = new URL(route.request().url()).pathname.replace(/^\/tests\//, "");
    const headers = {
      "Cross-Origin-Opener-Policy": "same-origin",
      "Cross-Origin-Embedder-Policy": "require-corp",
    };
    if (name === "blank.html") {
      return route.fulfill({ status: 200, contentType: "text/html", headers, body: "<!doctype html><title>tests</title>" });
    }
    // The same page without the isolation headers: no SharedArrayBuffer, so no wasm threads.
    if (name === "plain.html") {
      return route.fulfill({ status: 200, contentType: "text/html", body: "<!doctype html><title>tests, not isolated</title>" });
    }
    // The built-in model's files, as a user's safetensors folder.
    const model = name.match(/^tiny-kjv\/(config\.json|tokenizer\.json|model\.safetensors)$/);
    if (model) {
      return route.fulfill({ status: 200, contentType: "application/octet-stream", headers, body: readFileSync(path.join(ROOT, "assets/tiny-kjv", model[1])) });
    }
    // Files llama.cpp's own quantizer wrote (native-tests/fixtures/llama_cpp_kquants).
    const kquant = name.match(/^kquants\/(tiny\.[\w]+\.gguf)$/);
    if (kquant) {
      return route.fulfill({ status: 200, contentType: "application/octet-stream", headers, body: readFileSync(path.join(ROOT, "native-tests/fixtures/llama_cpp_kquants", kquant[1])) });
    }
    if (!/^[\w-]+\.js$/.test(name)) return route.fulfill({ status: 404, body: "" });
    return route.fulfill({ status: 200, contentType: "text/javascript", headers, body: readFileSync(path.join(ROOT, "web/tests", name)) });
  });
  return {
    page,
    logs,
    close: async () => {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/// Runs `body(browser)` in a browser from `launch(options)` and returns what it returns. If the
/// body throws, the page's console lines go to stderr first; the browser closes either way.
export async function withBrowser(options, body) {
  const browser = await launch(options);
  try {
    return await body(browser);
  } catch (e) {
    console.error(browser.logs.join("\n"));
    throw e;
  } finally {
    await browser.close();
  }
}
