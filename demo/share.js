// Sharing benchmark results: the report as a Markdown table (with its peers), and the peers
// (numpy, llama.cpp from `webtensor bench --peers`) next to webtensor's rows, as the library
// pairs them (peerRatios).
import { peerRatios } from "./pkg/webtensor.js";

const us = (v) => (v == null ? "—" : v.toFixed(1));
const num = (v, d = 2) => (v == null ? "—" : v.toFixed(d));

/// The report as Markdown: the backends, one row per timed op, and the peers where it has any.
export function reportMarkdown(report) {
  const lines = [`webtensor ${report.webtensor_version} · ${report.size} shapes`, ""];
  for (const b of report.backends) {
    lines.push(`- ${b.info.kind} on ${b.info.device_name || "?"}: copy ${num(b.ceilings.copy_gb_per_s)} GB/s${b.ceilings.read_gb_per_s == null ? "" : `, shader read ${num(b.ceilings.read_gb_per_s)} GB/s`}`);
  }
  lines.push("", "| op | case | shape | backend | median µs | GB/s | GFLOP/s |", "|---|---|---|---|---:|---:|---:|");
  for (const r of report.rows) {
    lines.push(`| ${r.op} | ${r.case} | ${r.shape} | ${r.backend} | ${us(r.median_us)} | ${num(r.gb_per_s)} | ${num(r.gflop_per_s)} |`);
  }
  const ratios = peerRatios(report);
  if (ratios.length) {
    lines.push("", "| peer | op | case | webtensor | peer | webtensor is |", "|---|---|---|---|---:|---:|");
    for (const p of ratios) lines.push(`| ${p.peer.peer} | ${p.peer.op} | ${p.peer.case} | ${p.webtensor} | ${num(p.peer_value, 1)} | ${num(p.speedup)}× faster |`);
  }
  return lines.join("\n") + "\n";
}

/// Shows the report's peers against webtensor's rows in `container` (nothing without peers).
export function drawPeers(container, report) {
  const ratios = peerRatios(report);
  container.replaceChildren();
  if (!ratios.length) return 0;
  const table = document.createElement("table");
  const caption = table.createCaption();
  caption.textContent = "Against peers timed on the same machine (above 1×: webtensor is faster)";
  const head = table.createTHead().insertRow();
  for (const h of ["peer", "op", "case", "webtensor", "webtensor (µs, or tokens/s)", "peer (same unit)", "speedup"]) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = h;
    head.appendChild(th);
  }
  const body = table.createTBody();
  for (const p of ratios) {
    const row = body.insertRow();
    for (const v of [p.peer.peer, p.peer.op, p.peer.case, p.webtensor, num(p.webtensor_value, 1), num(p.peer_value, 1), `${num(p.speedup)}×`]) {
      row.insertCell().textContent = v;
    }
  }
  container.appendChild(table);
  return ratios.length;
}
