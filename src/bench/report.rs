//! Printing a [`BenchReport`] as an aligned table.

use std::fmt::Write;

use super::merge::peer_ratios;
use super::BenchReport;

fn opt(v: Option<f64>, precision: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.precision$}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

/// The report as text: the machine and ceilings, one row per op, case and backend, then
/// each peer (numpy, llama.cpp) next to the webtensor row it mirrors.
pub fn table(report: &BenchReport) -> String {
    let mut out = String::new();
    for b in &report.backends {
        let i = &b.info;
        let _ = writeln!(
            out,
            "{:<9} {} ({}{})",
            i.kind.name(),
            i.device_name,
            i.api,
            if i.driver.is_empty() {
                String::new()
            } else {
                format!(", {}", i.driver)
            }
        );
        if !i.options.is_empty() {
            let pairs: Vec<String> = i.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(out, "          options: {}", pairs.join(" "));
        }
        let _ = writeln!(
            out,
            "          ceilings: copy {:.2} GB/s{}{}",
            b.ceilings.copy_gb_per_s,
            b.ceilings
                .read_gb_per_s
                .map_or(String::new(), |r| format!(", shader read {r:.2} GB/s")),
            b.ceilings
                .fma_gflop_per_s
                .map_or(String::new(), |p| format!(", FMA peak {p:.1} GFLOP/s"))
        );
    }
    let _ = writeln!(out);
    let header = [
        "op", "case", "shape", "backend", "µs", "GB/s", "% copy", "% read", "GFLOP/s", "% peak",
        "Melem/s", "check",
    ];
    let rows: Vec<[String; 12]> = report
        .rows
        .iter()
        .map(|r| {
            [
                r.op.name().to_string(),
                r.case.clone(),
                r.shape.clone(),
                r.backend.name().to_string(),
                opt(r.median_us, 1),
                opt(r.gb_per_s, 2),
                pct(r.frac_copy),
                pct(r.frac_read),
                opt(r.gflop_per_s, 2),
                pct(r.frac_peak),
                opt(r.melem_per_s, 1),
                r.verdict(),
            ]
        })
        .collect();
    // Text columns left-aligned, numbers right-aligned.
    out += &aligned_table(header, &rows, |i| !(i < 4 || i == 11));
    out += &peer_table(report);
    out
}

/// The peers next to webtensor (empty when the report has none): speedup is the peer's time
/// over webtensor's (above 1: webtensor is faster), tokens/s over tokens/s for `decode`.
fn peer_table(report: &BenchReport) -> String {
    let ratios = peer_ratios(report);
    if ratios.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("\npeers on the same machine (speedup = peer time / webtensor time):\n");
    let header = [
        "op",
        "case",
        "shape",
        "webtensor",
        "peer",
        "µs or tok/s",
        "peer's",
        "speedup",
    ];
    let rows: Vec<[String; 8]> = ratios
        .iter()
        .map(|r| {
            [
                r.peer.op.clone(),
                r.peer.case.clone(),
                r.peer.shape.clone(),
                r.webtensor.clone(),
                r.peer.peer.clone(),
                format!("{:.1}", r.webtensor_value),
                format!("{:.1}", r.peer_value),
                format!("{:.2}×", r.speedup),
            ]
        })
        .collect();
    out += &aligned_table(header, &rows, |_| false);
    out
}

/// `header` and `rows` as text columns padded to their widest cell, two spaces apart; the
/// columns where `right_aligned(i)` holds are padded on the left.
fn aligned_table<const N: usize>(
    header: [&str; N],
    rows: &[[String; N]],
    right_aligned: impl Fn(usize) -> bool,
) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            if right_aligned(i) {
                let _ = write!(s, "{pad}{cell}  ");
            } else {
                let _ = write!(s, "{cell}{pad}  ");
            }
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}", line(&header.map(String::from)));
    for r in rows {
        let _ = writeln!(out, "{}", line(r));
    }
    out
}
