//! `webtensor info`: every backend, present or why not, and what `Device::auto` picks.

use serde::Serialize;
use webtensor::backend::{registry, BackendInfo, BackendKind};
use webtensor::device::{Decision, PrioritySource};
use webtensor::{Device, Error};

/// One backend as `info` shows it.
#[derive(Serialize)]
struct BackendStatus {
    name: &'static str,
    present: bool,
    reason: Option<String>,
    info: Option<BackendInfo>,
}

#[derive(Serialize)]
struct AutoChoice {
    backend: &'static str,
    chain: Vec<BackendKind>,
    priority_source: PrioritySource,
    decisions: Vec<Decision>,
}

#[derive(Serialize)]
struct InfoReport {
    webtensor_version: &'static str,
    backends: Vec<BackendStatus>,
    auto: Option<AutoChoice>,
    auto_error: Option<String>,
}

pub fn info(json: bool) -> Result<(), Error> {
    // The options `Device::auto` starts the backends with: the environment's overrides.
    let options = webtensor::BackendOptions::from_env()?;
    let backends = BackendKind::ALL
        .into_iter()
        .map(|kind| match registry::get_with(kind, &options) {
            Ok(b) => BackendStatus {
                name: kind.name(),
                present: true,
                reason: None,
                info: Some(b.info()),
            },
            Err(reason) => BackendStatus {
                name: kind.name(),
                present: false,
                reason: Some(reason),
                info: None,
            },
        })
        .collect();
    let (auto, auto_error) = match Device::auto() {
        Ok(d) => (
            Some(AutoChoice {
                backend: d.backend_name(),
                chain: d.chain(),
                priority_source: d.priority_source().clone(),
                decisions: d.decisions().to_vec(),
            }),
            None,
        ),
        Err(e) => (None, Some(e.to_string())),
    };
    let report = InfoReport {
        webtensor_version: env!("CARGO_PKG_VERSION"),
        backends,
        auto,
        auto_error,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serialises")
        );
    } else {
        print!("{}", info_text(&report));
    }
    Ok(())
}

pub fn bytes(v: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = v as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v} B")
    } else if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.2} {} ({v} bytes)", UNITS[unit])
    }
}

fn info_text(report: &InfoReport) -> String {
    let mut out = format!("webtensor {}\n\n", report.webtensor_version);
    for b in &report.backends {
        match (&b.info, &b.reason) {
            (Some(i), _) => {
                out += &format!("{:<10} present  {}\n", b.name, i.device_name);
                let mut field = |label: &str, value: String| {
                    if !value.is_empty() {
                        out += &format!("{:<10}   {label:<10} {value}\n", "");
                    }
                };
                field("class", format!("{:?}", i.class).to_lowercase());
                field("vendor", i.vendor.clone());
                field("driver", i.driver.clone());
                field("api", i.api.clone());
                field("features", i.features.join(", "));
                field("simd", i.simd.clone().unwrap_or_default());
                field("f16", i.f16_path.clone());
                field("reductions", i.reductions.clone());
                field("prefill", i.prefill.clone());
                field("profiler", i.profiler.clone());
                let options: Vec<_> = i.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
                field("options", options.join(" "));
                field("variants", i.variants.join(", "));
                field(
                    "threads",
                    i.threads.map(|t| t.to_string()).unwrap_or_default(),
                );
                for (name, value) in &i.limits {
                    let shown = if name.ends_with("size") {
                        bytes(*value)
                    } else {
                        value.to_string()
                    };
                    field("limit", format!("{name} = {shown}"));
                }
                let missing: Vec<_> = i.missing_ops.iter().map(|o| o.name()).collect();
                field("falls back", missing.join(", "));
            }
            (None, reason) => {
                out += &format!(
                    "{:<10} absent   {}\n",
                    b.name,
                    reason.clone().unwrap_or_default()
                );
            }
        }
        out += "\n";
    }
    match (&report.auto, &report.auto_error) {
        (Some(a), _) => {
            let chain: Vec<_> = a.chain.iter().map(|k| k.name()).collect();
            out += &format!(
                "auto picks: {}   (chain: {})\n",
                a.backend,
                chain.join(" → ")
            );
            for d in &a.decisions {
                out += &format!("  {:<10} {}\n", d.kind.name(), d.reason);
            }
        }
        (None, Some(e)) => out += &format!("auto fails: {e}\n"),
        (None, None) => {}
    }
    out
}
