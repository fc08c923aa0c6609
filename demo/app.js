// The demo page: picks a device, loads a model, streams generated text, and runs the op
// benchmarks, all through web/pkg (served at ./pkg/ by `webtensor serve`). The model loads and
// generates in a Web Worker (createWorkerModel), so the page never freezes while it works.
import init, { createDevice, createWorkerModel, webgpuUnavailableReason, runBenchmarks, version } from "./pkg/webtensor.js";
import { drawChart } from "./chart.js";
import { deleteSelected, refreshCache, showEstimate } from "./models.js";
import { drawPeers, reportMarkdown } from "./share.js";

const $ = (id) => document.getElementById(id);
const page = { device: null, model: null, report: null, messages: [] };

function setState(state) {
  document.body.dataset.state = state;
}

function showError(where, e) {
  where.textContent = String(e && e.message ? e.message : e);
  where.classList.add("error");
}

/// Creates the device asked for (URL ?backend=, or the select), falling back to auto when a
/// named backend is not available here, and says plainly what runs and why.
async function startDevice(wanted) {
  const status = $("backend-status");
  const note = $("backend-note");
  status.classList.remove("fallback", "error");
  note.textContent = "";
  let device;
  let fellBack = null;
  try {
    device = await createDevice(wanted === "auto" ? undefined : wanted);
  } catch (e) {
    fellBack = e.message;
    device = await createDevice();
  }
  const info = device.info();
  const i = info.info;
  if (device.backend === "wgpu") {
    const adapter = i.device_name || "a WebGPU adapter";
    status.textContent = `Backend: wgpu on ${adapter} (WebGPU${i.class === "software" ? ", a software adapter" : ""})`;
  } else {
    const gpuReason = fellBack ?? (await webgpuUnavailableReason());
    const simd = i.simd ? `, ${i.simd}` : "";
    if (gpuReason) {
      status.textContent = `WebGPU is not available, so this page fell back to the cpu backend (wasm${simd}, one thread).`;
      status.classList.add("fallback");
      note.textContent = `Why: ${gpuReason}`;
    } else {
      status.textContent = `Backend: ${device.backend} (wasm${simd}, one thread)`;
      const wgpu = info.decisions.find((d) => d.kind === "wgpu");
      if (wgpu) note.textContent = `wgpu: ${wgpu.reason}`;
    }
  }
  if (fellBack && device.backend === "wgpu") note.textContent = `${wanted} is not available (${fellBack}); auto chose wgpu.`;
  $("bench-wgpu").checked = !(await webgpuUnavailableReason());
  $("bench-wgpu").disabled = !$("bench-wgpu").checked;
  return device;
}

function progressTo(bar, label) {
  return (phase, done, total) => {
    bar.max = total > 0 ? total : 1;
    bar.value = total > 0 ? done : 0;
    const names = { cache: "from the cache", download: "download", read: "read", parse: "parse", upload: "upload to the device" };
    phase = names[phase] ?? phase;
    // The upload counts layers (and the output head) placed on the device, the others bytes.
    label.textContent = phase === "upload to the device"
      ? (total > 1 ? `${phase}: ${done} / ${total}` : `${phase}…`)
      : total > 0 && phase !== "parse"
        ? `${phase}: ${(done / 1e6).toFixed(1)} / ${(total / 1e6).toFixed(1)} MB`
        : `${phase}…`;
  };
}

async function loadModel() {
  const status = $("model-status");
  status.classList.remove("error");
  $("generate").disabled = true;
  setState("loading");
  const source = document.querySelector("input[name=source]:checked").value;
  const progress = progressTo($("load-progress"), status);
  try {
    let from = { builtin: true };
    if (source === "gguf") {
      const file = $("gguf-file").files[0];
      if (!file) throw new Error("pick a .gguf file first");
      from = { files: [file] };
    } else if (source === "url" || source === "cache") {
      const url = source === "url" ? $("model-url").value.trim() : $("cached-models").value;
      if (!url) throw new Error(source === "url" ? "enter the URL of a .gguf file first" : "no cached model: load one by URL first");
      if (source === "url") await showEstimate(page.device, url);
      from = { url };
    } else if (source === "folder") {
      const files = $("folder-files").files;
      if (!files.length) throw new Error("pick a folder with config.json, tokenizer.json and *.safetensors first");
      from = { files: [...files] };
    }
    page.model?.terminate();
    page.model = null;
    page.model = await createWorkerModel({ backend: page.device.backend, source: from, progress });
    if (from.url) await refreshCache();
    const c = page.model.config();
    // The weight formats (a GGUF's mix: q4_k and q6_k for Q4_K_M) and the product each runs.
    status.textContent = `${page.model.name}: ${c.num_hidden_layers} layers, hidden ${c.hidden_size}, vocabulary ${c.vocab_size}, on ${page.device.backend}; ${page.model.activationPath}`;
    // Chat mode is offered for models with a chat template of their own: without one
    // Model.chat renders ChatML, which a model not trained on it rarely answers in.
    const chat = $("chat-mode");
    chat.disabled = !page.model.chatTemplate;
    chat.checked = chat.checked && !chat.disabled;
    page.messages = [];
    $("new-chat").hidden = !chat.checked;
    $("chat-box").hidden = !chat.checked;
    $("generate").disabled = false;
    setState("ready");
  } catch (e) {
    showError(status, e);
    setState("error");
  }
}

async function generate() {
  const out = $("output");
  const stats = $("gen-stats");
  stats.classList.remove("error");
  out.textContent = "";
  $("generate").disabled = true;
  $("stop").disabled = false;
  setState("generating");
  const options = {
    maxTokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    topK: Number($("top-k").value),
    topP: Number($("top-p").value),
    seed: Number($("seed").value),
  };
  const chat = $("chat-mode").checked;
  const prompt = $("prompt").value;
  let started = !chat;
  const onToken = (piece, n, tps) => {
    // A reply starts without the space a byte-level vocabulary puts before its first word.
    out.textContent += started ? piece : piece.trimStart();
    started ||= piece.trim() !== "";
    stats.textContent = `${n} tokens · ${tps.toFixed(1)} tokens/s`;
  };
  try {
    let result;
    if (chat) {
      // One turn: the conversation so far plus this message, through the model's template.
      page.messages.push({ role: "user", content: prompt });
      out.textContent = transcript(page.messages) + "\n\nassistant: ";
      const system = $("system-prompt").value.trim();
      const turns = system ? [{ role: "system", content: system }, ...page.messages] : page.messages;
      result = await page.model.chat(turns, options, onToken);
      page.messages.push({ role: "assistant", content: result.text.trim() });
      $("prompt").value = "";
    } else {
      out.textContent = prompt;
      result = await page.model.generate(prompt, options, onToken);
    }
    const end = result.stopped ? " (stopped)" : result.stoppedAtEos ? " (end of text)" : "";
    stats.textContent = `${result.generatedTokens} tokens · ${result.tokensPerSec.toFixed(1)} tokens/s on ${page.device.backend} · prompt ${result.promptTokens} tokens in ${(result.promptSecs * 1e3).toFixed(0)} ms${end}`;
    setState("done");
  } catch (e) {
    if (chat) page.messages.pop();
    showError(stats, e);
    setState("error");
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

function transcript(messages) {
  return messages.map((m) => `${m.role}: ${m.content}`).join("\n\n");
}

function newChat() {
  page.messages = [];
  $("output").textContent = "";
  $("new-chat").hidden = !$("chat-mode").checked;
  $("chat-box").hidden = !$("chat-mode").checked;
}

async function runBench() {
  const status = $("bench-status");
  status.classList.remove("error");
  const backends = ["wgpu", "cpu"].filter((b) => $(`bench-${b}`).checked);
  const ops = $("bench-ops").value.split(",").map((s) => s.trim()).filter(Boolean);
  const bar = $("bench-progress");
  $("bench-run").disabled = true;
  document.body.dataset.bench = "running";
  try {
    page.report = await runBenchmarks({ backends, ops, runs: Number($("bench-runs").value) }, (done, total, label) => {
      bar.max = total;
      bar.value = done;
      status.textContent = label;
    });
    showReport(page.report);
    status.textContent = `${page.report.rows.length} rows`;
    document.body.dataset.bench = "done";
  } catch (e) {
    showError(status, e);
    document.body.dataset.bench = "error";
  } finally {
    $("bench-run").disabled = false;
  }
}

/// Draws a report (run here or loaded from a file): the chart, its peers, and the buttons.
function showReport(report) {
  page.report = report;
  window.benchReport = report;
  drawChart($("bench-chart"), report);
  drawPeers($("bench-peers"), report);
  $("bench-download").disabled = false;
  $("bench-copy").disabled = false;
}

/// Loads a report.json (from `webtensor bench --json`, `--report`, or this page).
async function loadReport(e) {
  const status = $("bench-status");
  status.classList.remove("error");
  const file = e.target.files[0];
  if (!file) return;
  try {
    const report = JSON.parse(await file.text());
    showReport(report);
    status.textContent = `${file.name}: ${report.rows.length} rows, ${report.peers?.length ?? 0} peers`;
    document.body.dataset.bench = "done";
  } catch (err) {
    showError(status, err);
  }
}

async function copyMarkdown() {
  const text = reportMarkdown(page.report);
  window.benchMarkdown = text;
  try {
    await navigator.clipboard.writeText(text);
    $("bench-status").textContent = "Copied the table as Markdown.";
  } catch (err) {
    $("bench-status").textContent = `Could not copy (${err.message}); the Markdown is in window.benchMarkdown.`;
  }
}

function download() {
  const blob = new Blob([JSON.stringify(page.report, null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "webtensor-bench-browser.json";
  a.click();
  URL.revokeObjectURL(a.href);
}

function showTab(name) {
  for (const t of document.querySelectorAll(".tab")) {
    t.classList.toggle("active", t.dataset.tab === name);
    t.setAttribute("aria-selected", String(t.dataset.tab === name));
  }
  $("tab-generate").hidden = name !== "generate";
  $("tab-bench").hidden = name !== "bench";
}

async function main() {
  await init();
  $("version").textContent = `v${version()}`;
  const wanted = new URLSearchParams(location.search).get("backend") || "auto";
  $("backend-select").value = wanted;
  page.device = await startDevice(wanted);
  $("backend-select").addEventListener("change", async (e) => {
    page.device = await startDevice(e.target.value);
    await loadModel();
  });
  $("load").addEventListener("click", loadModel);
  $("generate").addEventListener("click", generate);
  $("stop").addEventListener("click", () => page.model && page.model.stop());
  $("chat-mode").addEventListener("change", newChat);
  $("new-chat").addEventListener("click", newChat);
  $("bench-run").addEventListener("click", runBench);
  $("bench-download").addEventListener("click", download);
  $("bench-copy").addEventListener("click", copyMarkdown);
  $("bench-load").addEventListener("change", loadReport);
  $("delete-cached").addEventListener("click", deleteSelected);
  // Picking a file, URL or cached model selects its source.
  for (const [id, source] of [["gguf-file", "gguf"], ["folder-files", "folder"], ["model-url", "url"], ["cached-models", "cache"]]) {
    $(id).addEventListener("input", () => (document.querySelector(`input[name=source][value=${source}]`).checked = true));
  }
  await refreshCache();
  for (const t of document.querySelectorAll(".tab")) t.addEventListener("click", () => showTab(t.dataset.tab));
  await loadModel();
}

main().catch((e) => {
  showError($("backend-status"), e);
  setState("error");
});
