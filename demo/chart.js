// The benchmark bar chart: one bar per (op, case, backend) row, length ∝ GB/s, with the
// median time and the throughput written beside it. Plain inline SVG.

const COLORS = { wgpu: "#3a6fd8", cpu: "#d8843a", reference: "#888" };
const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function figure(row) {
  if (row.median_us == null) return `failed check: ${row.error}`;
  const speed = row.gflop_per_s != null
    ? `${row.gflop_per_s.toFixed(2)} GFLOP/s`
    : row.melem_per_s != null
      ? `${row.melem_per_s.toFixed(1)} Melem/s`
      : `${row.gb_per_s.toFixed(2)} GB/s`;
  return `${row.median_us.toFixed(1)} µs · ${speed}`;
}

export function drawChart(container, report) {
  const rows = report.rows;
  const max = Math.max(1e-9, ...rows.map((r) => r.gb_per_s ?? 0));
  const rowH = 18, labelW = 250, barW = 300, textW = 230;
  const svg = el("svg", { width: labelW + barW + textW, height: rows.length * rowH + 30, role: "img" });
  svg.appendChild(el("text", { x: 0, y: 12 }, "bar: GB/s moved (inputs + output); beside it: median time per op and throughput"));
  rows.forEach((r, i) => {
    const y = 22 + i * rowH;
    svg.appendChild(el("text", { x: 0, y: y + 12 }, `${r.op} ${r.case} · ${r.backend}`));
    const w = r.gb_per_s ? Math.max(1, (r.gb_per_s / max) * barW) : 0;
    svg.appendChild(el("rect", { x: labelW, y: y + 2, width: w, height: rowH - 5, fill: COLORS[r.backend] || "#555" }));
    svg.appendChild(el("text", { x: labelW + w + 6, y: y + 12 }, figure(r)));
  });
  const ceilings = report.backends
    .map((b) => `${b.info.kind}: copy ${b.ceilings.copy_gb_per_s.toFixed(2)} GB/s${b.ceilings.read_gb_per_s ? `, shader read ${b.ceilings.read_gb_per_s.toFixed(2)} GB/s` : ""}${b.ceilings.fma_gflop_per_s ? `, FMA ${b.ceilings.fma_gflop_per_s.toFixed(1)} GFLOP/s` : ""} ${b.info.device_name ? ` (${b.info.device_name})` : ""}`)
    .join(" · ");
  container.replaceChildren(el("svg", { width: 0, height: 0 }));
  const p = document.createElement("p");
  p.textContent = `Ceilings measured in this run: ${ceilings}`;
  container.replaceChildren(p, svg);
}
