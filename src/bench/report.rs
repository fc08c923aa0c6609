//! Printing a [`BenchReport`] as an aligned table.

use std::fmt::Write;

use super::BenchReport;

fn opt(v: Option<f64>, precision: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.precision$}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

/// The report as text: the machine and ceilings, then one row per op, case and backend.
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
        let _ = writeln!(
            out,
            "          ceilings: copy {:.2} GB/s{}",
            b.ceilings.copy_gb_per_s,
            b.ceilings
                .fma_gflop_per_s
                .map_or(String::new(), |p| format!(", FMA peak {p:.1} GFLOP/s"))
        );
    }
    let _ = writeln!(out);
    let header = [
        "op", "case", "shape", "backend", "µs", "GB/s", "% copy", "GFLOP/s", "% peak", "Melem/s",
        "check",
    ];
    let rows: Vec<[String; 11]> = report
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
                opt(r.gflop_per_s, 2),
                pct(r.frac_peak),
                opt(r.melem_per_s, 1),
                if r.checked {
                    "ok".into()
                } else {
                    format!("FAILED: {}", r.error.clone().unwrap_or_default())
                },
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            // Text columns left-aligned, numbers right-aligned.
            if i < 4 || i == 10 {
                let _ = write!(s, "{cell}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(s, "{}{cell}  ", " ".repeat(pad));
            }
        }
        s.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(&header.map(String::from)));
    for r in &rows {
        let _ = writeln!(out, "{}", line(r));
    }
    out
}
