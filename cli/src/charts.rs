//! `webtensor bench --report DIR`: `report.json` and a self-contained `report.html` whose
//! charts are inline SVG drawn by plotters.
//!
//! Per op: the median time of every checked row (case, shape, backend and device), and its
//! fraction of the ceiling measured in the same run on the same backend (FMA peak where one
//! was measured, else copy bandwidth); a table with time, GB/s, GFLOP/s and the fractions.
//! Rows whose output did not match the reference, or that the device refused to run, are listed
//! without figures and with the reason. Peers (numpy, llama.cpp) appear as speed ratios to the
//! webtensor rows of the same op, case and shape.

use std::fmt::Write;
use std::path::Path;

use plotters::prelude::*;

use webtensor::bench::merge::peer_ratios;
use webtensor::bench::{BenchReport, BenchRow};
use webtensor::error::{Error, Result};

/// Writes `report.json` and `report.html` into `dir` (created if needed).
pub fn write(report: &BenchReport, dir: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = serde_json::to_string_pretty(report).map_err(|e| Error::Io {
        path: dir.join("report.json").display().to_string(),
        source: e.into(),
    })?;
    let json_path = dir.join("report.json");
    std::fs::write(&json_path, json).map_err(io(&json_path))?;
    let html_path = dir.join("report.html");
    std::fs::write(&html_path, html(report)?).map_err(io(&html_path))?;
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn num(v: Option<f64>, precision: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.precision$}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{:.1}%", v * 100.0))
}

/// The fraction of the ceiling a row reached: of the FMA peak where measured, else of copy.
fn ceiling_fraction(r: &BenchRow) -> Option<f64> {
    r.frac_peak.or(r.frac_copy)
}

/// A colour per backend, the same in every chart.
fn backend_colour(label: &str) -> RGBColor {
    match label.split(' ').next().unwrap_or("") {
        "cuda" => RGBColor(118, 185, 0),
        "wgpu" => RGBColor(66, 133, 244),
        "cpu" => RGBColor(230, 145, 56),
        _ => RGBColor(150, 150, 150),
    }
}

/// A horizontal bar chart as an SVG string: one bar per (label, value).
fn bar_chart(title: &str, unit: &str, bars: &[(String, f64)]) -> Result<String> {
    let draw_err = |e: &dyn std::fmt::Display| Error::Io {
        path: format!("the chart '{title}'"),
        source: std::io::Error::other(e.to_string()),
    };
    let mut svg = String::new();
    {
        let height = 70 + 24 * bars.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (960, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.15;
        let n = bars.len();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 15))
            .margin(6)
            .x_label_area_size(28)
            .y_label_area_size(470)
            .build_cartesian_2d(0f64..max, (0..n).into_segmented())
            .map_err(|e| draw_err(&e))?;
        let label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map(|b| b.0.clone()).unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&label)
            .x_desc(unit)
            .label_style(("sans-serif", 11))
            .draw()
            .map_err(|e| draw_err(&e))?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (name, v))| {
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (*v, SegmentValue::Exact(i + 1)),
                    ],
                    backend_colour(name).filled(),
                );
                bar.set_margin(3, 3, 0, 0);
                bar
            }))
            .map_err(|e| draw_err(&e))?;
        root.present().map_err(|e| draw_err(&e))?;
    }
    Ok(svg)
}

/// The whole report as one HTML page.
pub fn html(report: &BenchReport) -> Result<String> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>webtensor bench</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 7px;\
         font-size:13px}}td.n{{text-align:right}}h2{{margin-top:2em}}</style></head><body>\
         <h1>webtensor benchmark report</h1><p>webtensor {}, schema {}, size {:?}. Every figure \
         below comes from a row whose output matched the reference backend in the same run; \
         fractions are of the ceilings measured in that run on that backend.</p>",
        esc(&report.webtensor_version),
        report.schema_version,
        report.size
    );
    h += "<h2>Machines and ceilings</h2><table><tr><th>backend</th><th>device</th><th>vendor</th>\
          <th>driver</th><th>api</th><th>features</th><th>copy GB/s</th><th>shader read GB/s</th>\
          <th>FMA peak GFLOP/s</th></tr>";
    for b in &report.backends {
        let i = &b.info;
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=n>{:.2}</td><td class=n>{}</td><td class=n>{}</td></tr>",
            i.kind,
            esc(&i.device_name),
            esc(&i.vendor),
            esc(&i.driver),
            esc(&i.api),
            esc(&i.features.join(", ")),
            b.ceilings.copy_gb_per_s,
            num(b.ceilings.read_gb_per_s, 2),
            num(b.ceilings.fma_gflop_per_s, 1)
        );
    }
    h += "</table>";

    let ratios = peer_ratios(report);
    if !ratios.is_empty() {
        h += "<h2>Peers on the same machine</h2><p>speedup = peer time / webtensor time \
              (tokens/s ratio for decode); above 1 webtensor is faster.</p><table><tr>\
              <th>op</th><th>case</th><th>shape</th><th>webtensor</th><th>peer</th>\
              <th>webtensor</th><th>peer</th><th>speedup</th></tr>";
        let mut bars = Vec::new();
        for r in &ratios {
            let unit = if r.peer.op == "decode" {
                "tok/s"
            } else {
                "µs"
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td class=n>{:.1} {unit}</td><td class=n>{:.1} {unit}</td><td class=n>{:.2}×</td></tr>",
                esc(&r.peer.op),
                esc(&r.peer.case),
                esc(&r.peer.shape),
                esc(&r.webtensor),
                esc(&r.peer.peer),
                r.webtensor_value,
                r.peer_value,
                r.speedup
            );
            bars.push((
                format!(
                    "{} vs {} · {} {}",
                    r.webtensor, r.peer.peer, r.peer.op, r.peer.case
                ),
                r.speedup,
            ));
        }
        h += "</table>";
        h += &bar_chart(
            "webtensor speed relative to the peer",
            "× (peer time / webtensor time)",
            &bars,
        )?;
    }

    let mut ops: Vec<_> = report.rows.iter().map(|r| r.op).collect();
    ops.sort();
    ops.dedup();
    for op in ops {
        let rows: Vec<&BenchRow> = report.rows.iter().filter(|r| r.op == op).collect();
        let good: Vec<&&BenchRow> = rows
            .iter()
            .filter(|r| r.checked && r.median_us.is_some())
            .collect();
        let _ = write!(h, "<h2>{op}</h2>");
        let label = |r: &BenchRow| format!("{} · {} — {} {}", r.backend, r.device, r.case, r.shape);
        if !good.is_empty() {
            let times: Vec<_> = good
                .iter()
                .map(|r| (label(r), r.median_us.unwrap_or(0.0)))
                .collect();
            h += &bar_chart(&format!("{op}: median time per op"), "µs", &times)?;
            let fracs: Vec<_> = good
                .iter()
                .filter_map(|r| ceiling_fraction(r).map(|f| (label(r), f * 100.0)))
                .collect();
            if !fracs.is_empty() {
                h += &bar_chart(
                    &format!("{op}: fraction of the ceiling measured in the same run"),
                    "% of FMA peak (matmul on cpu) or of copy bandwidth",
                    &fracs,
                )?;
            }
        }
        h += "<table><tr><th>case</th><th>shape</th><th>backend</th><th>device</th><th>µs</th>\
              <th>GB/s</th><th>% copy</th><th>% read</th><th>GFLOP/s</th><th>% peak</th>\
              <th>Melem/s</th><th>check</th></tr>";
        for r in rows {
            let check = esc(&r.verdict());
            let shown = |v: Option<f64>| if r.checked { v } else { None };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=n>{}</td>\
                 <td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td>\
                 <td class=n>{}</td><td class=n>{}</td><td>{check}</td></tr>",
                esc(&r.case),
                esc(&r.shape),
                r.backend,
                esc(&r.device),
                num(shown(r.median_us), 1),
                num(shown(r.gb_per_s), 2),
                pct(shown(r.frac_copy)),
                pct(shown(r.frac_read)),
                num(shown(r.gflop_per_s), 2),
                pct(shown(r.frac_peak)),
                num(shown(r.melem_per_s), 1),
            );
        }
        h += "</table>";
    }
    h += "</body></html>\n";
    Ok(h)
}
