// The demo page as a user meets it: keyboard-only use, WCAG AA text contrast, a 390×844 phone
// screen without sideways scrolling, chat mode (system prompt, two turns, clear) with a model
// whose folder has a chat template, a model by URL then from the cache, and a loaded report's
// peers with "copy as Markdown". Screenshots (desktop, phone, chat, cached model, peers) go to
// target/browser-artifacts. Run by scripts/test.sh after web/build.sh.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { ARTIFACTS, ROOT, withBrowser, startServer } from "./harness.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

const FIXTURE = path.join(ROOT, "native-tests/fixtures/gguf/llama31.q8_0.gguf");
const shot = (page, name) => page.screenshot({ path: path.join(ARTIFACTS, name), fullPage: true });

async function ready(page) {
  await page.waitForSelector("body[data-state=ready]", { timeout: 180_000 });
}

/// Text whose contrast with its background is under WCAG AA (4.5:1, 3:1 for large text).
function lowContrast() {
  const parse = (c) => (c.match(/[\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    const text = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent.trim()).join("");
    if (!text || el.closest("[hidden]") || el.disabled || el.closest("svg") || !el.getClientRects().length) continue;
    const style = getComputedStyle(el);
    const [l1, l2] = [lum(parse(style.color)), lum(background(el))].sort((a, b) => b - a);
    const ratio = (l1 + 0.05) / (l2 + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) out.push(`${el.tagName}#${el.id} "${text.slice(0, 30)}": ${ratio.toFixed(2)}`);
  }
  return out;
}

test("the demo: keyboard, contrast, phone width, chat mode, a cached model, peers and Markdown", { timeout: 600_000 }, async (t) => {
  const work = mkdtempSync(path.join(tmpdir(), "webtensor-demo-"));
  try {
    await withBrowser({ webgpu: false }, async ({ page }) => {
      await page.context().grantPermissions(["clipboard-read", "clipboard-write"]);
      await page.route("**/tests/models/tiny.gguf", (route) => route.fulfill({ status: 200, contentType: "application/octet-stream", body: readFileSync(FIXTURE) }));
      await page.goto(server.url);
      await ready(page);

      // Keyboard only: Tab reaches every control of the model and generate panels.
      const reached = new Set();
      for (let i = 0; i < 40; i++) {
        await page.keyboard.press("Tab");
        reached.add(await page.evaluate(() => document.activeElement?.id || document.activeElement?.tagName));
      }
      for (const id of ["backend-select", "tab-generate-button", "tab-bench-button", "gguf-file", "model-url", "cached-models", "load", "prompt", "max-tokens", "generate"]) {
        assert.ok(reached.has(id), `Tab never reaches #${id} (reached: ${[...reached].join(", ")})`);
      }
      await page.focus("#prompt");
      await page.keyboard.press("Tab");
      await page.focus("#generate");
      await page.keyboard.press("Enter");
      await page.waitForSelector("body[data-state=done]", { timeout: 180_000 });
      assert.ok((await page.textContent("#output")).length > 20);
      assert.deepEqual(await page.evaluate(lowContrast), [], "text under WCAG AA contrast");
      await shot(page, "demo-desktop.png");

      // Phone width: nothing scrolls sideways.
      await page.setViewportSize({ width: 390, height: 844 });
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 390, `the page is ${width} px wide at 390`);
      await shot(page, "demo-phone.png");

      // Chat mode, with a model folder that has a chat template.
      const folder = path.join(work, "tiny-kjv-chat");
      mkdirSync(folder);
      for (const f of ["config.json", "tokenizer.json", "model.safetensors"]) copyFileSync(path.join(ROOT, "assets/tiny-kjv", f), path.join(folder, f));
      const template =
        "{% for m in messages %}{{ bos_token }}{{ m.role }}: {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}" +
        "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}";
      writeFileSync(path.join(folder, "tokenizer_config.json"), JSON.stringify({ bos_token: "<s>", eos_token: "</s>", chat_template: template }));
      await page.setInputFiles("#folder-files", folder);
      await page.click("#load");
      await ready(page);
      await page.check("#chat-mode");
      assert.equal(await page.isVisible("#system-prompt"), true);
      await page.fill("#system-prompt", "Answer in the words of the King James Bible.");
      await page.fill("#max-tokens", "12");
      for (const turn of ["In the beginning", "And God said"]) {
        await page.fill("#prompt", turn);
        await page.click("#generate");
        await page.waitForSelector("body[data-state=done]", { timeout: 180_000 });
      }
      const chat = await page.textContent("#output");
      assert.match(chat, /user: In the beginning[\s\S]*assistant: [\s\S]*user: And God said[\s\S]*assistant: /);
      t.diagnostic(`chat stats: ${await page.textContent("#gen-stats")}`);
      await shot(page, "demo-chat.png");
      await page.click("#new-chat");
      assert.equal(await page.textContent("#output"), "");

      // A model by URL, then from the cache after a reload.
      await page.setViewportSize({ width: 1000, height: 900 });
      await page.fill("#model-url", `${server.url}tests/models/tiny.gguf`);
      await page.click("#load");
      await ready(page);
      assert.match(await page.textContent("#model-estimate"), /MB download/);
      await page.reload();
      await ready(page);
      const cached = await page.$$eval("#cached-models option", (o) => o.map((x) => x.textContent));
      assert.equal(cached.length, 1);
      assert.match(cached[0], /tiny\.gguf \(0\.0 MB\)/);
      await page.check("input[name=source][value=cache]");
      await page.click("#load");
      await ready(page);
      assert.match(await page.textContent("#model-status"), /tiny\.gguf/);
      await shot(page, "demo-cached.png");

      // The benchmark tab: a report with peers, loaded from a file, and copied as Markdown.
      const bin = process.env.WEBTENSOR_BIN || path.join(ROOT, "target/debug/webtensor");
      const ops = JSON.parse(execFileSync(bin, ["bench", "--backend", "cpu", "--op", "add", "--runs", "1", "--json"], { encoding: "utf8" }));
      const row = ops.rows[0];
      writeFileSync(path.join(work, "ops.json"), JSON.stringify(ops));
      writeFileSync(path.join(work, "peers.json"), JSON.stringify({ machine: "this machine", peers: [{ peer: "numpy 2", op: row.op, case: row.case, shape: row.shape, median_us: row.median_us * 2 }] }));
      const merged = execFileSync(bin, ["bench", "--merge", path.join(work, "ops.json"), "--peers", path.join(work, "peers.json"), "--json"], { encoding: "utf8" });
      writeFileSync(path.join(work, "report.json"), merged);
      await page.click("#tab-bench-button");
      await page.setInputFiles("#bench-load", path.join(work, "report.json"));
      await page.waitForSelector("#bench-peers table");
      const peerRow = await page.$$eval("#bench-peers tbody tr", (rows) => rows.map((r) => r.textContent));
      assert.equal(peerRow.length, 1);
      assert.match(peerRow[0], /numpy 2.*2\.00×/);
      await page.click("#bench-copy");
      const markdown = await page.evaluate(() => window.benchMarkdown);
      assert.match(markdown, new RegExp(`\\| ${row.op} \\| ${row.case.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} \\|`));
      assert.match(markdown, /\| numpy 2 \| .* \| 2\.00× faster \|/);
      await shot(page, "demo-peers.png");
      assert.deepEqual(await page.evaluate(lowContrast), [], "text under WCAG AA contrast on the benchmark tab");
    });
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
});
