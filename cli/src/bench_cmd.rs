//! `webtensor bench`: op timings against ceilings, `--model` token rates, `--merge`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use webtensor::backend::{registry, BackendKind, OpKind};
use webtensor::bench::{self, BenchConfig, Size};
use webtensor::Error;
use webtensor_llm::{ActivationMode, ModelFiles};

use super::{peer, SizeArg};

/// The backends named, or every present one but `reference`.
fn bench_backends(names: &[String]) -> Result<Vec<BackendKind>, Error> {
    if names.is_empty() {
        return Ok(BackendKind::ALL
            .into_iter()
            .filter(|&k| k != BackendKind::Reference && registry::get(k).is_ok())
            .collect());
    }
    names.iter().map(|n| BackendKind::parse(n)).collect()
}

pub fn bench_model(
    backends: &[String],
    model: &str,
    (prompt_tokens, decode_tokens): (usize, usize),
    activations: ActivationMode,
    (runs, peers, tp): (usize, &[String], &[usize]),
    json: bool,
) -> Result<(), Error> {
    let backends = bench_backends(backends)?;
    let resolved = super::models::resolve(std::path::Path::new(model))?;
    let open = || -> Result<ModelFiles, Error> {
        match &resolved {
            None => webtensor_llm::builtin::files(),
            Some(path) => ModelFiles::open(path),
        }
    };
    let with_llama_cpp = match peers {
        [] => false,
        [empty] if empty.is_empty() => true,
        _ => {
            return Err(Error::InvalidArgument {
                op: "bench",
                reason: "with --model, --peers takes no file: it times llama.cpp on the same GGUF"
                    .into(),
            })
        }
    };
    let path = resolved.as_deref().unwrap_or(std::path::Path::new(model));
    if with_llama_cpp && path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Err(Error::InvalidArgument {
            op: "bench",
            reason: format!("--peers runs llama.cpp, which needs a .gguf file; {model} is not one"),
        });
    }
    let threads = rayon::current_num_threads();
    let llama_cpp = |p: usize, d: usize| peer::llama_cpp(path, threads, p, d);
    let peer: Option<
        &dyn Fn(usize, usize) -> Result<webtensor_llm::bench::model::PeerSample, Error>,
    > = with_llama_cpp.then_some(&llama_cpp);
    let tokens = (prompt_tokens, decode_tokens);
    let options = webtensor::BackendOptions::from_env()?;
    let rows = webtensor_llm::bench::model::run(
        &open,
        &backends,
        tokens,
        activations,
        &options,
        runs,
        peer,
        |step| eprintln!("{step}"),
    )?;
    let tp_rows = if tp.is_empty() {
        Vec::new()
    } else {
        webtensor_llm::bench::tensor_parallel::run(
            &open,
            &backends,
            tp,
            tokens,
            (activations, &options),
            runs,
            |step| eprintln!("{step}"),
        )?
    };
    if json {
        let value = if tp.is_empty() {
            serde_json::to_value(&rows)
        } else {
            serde_json::to_value(serde_json::json!({ "rows": rows, "tp": tp_rows }))
        };
        let text = value
            .and_then(|v| serde_json::to_string_pretty(&v))
            .map_err(|e| Error::Tool {
                part: "cli",
                message: e.to_string(),
            })?;
        println!("{text}");
    } else {
        print!("{}", webtensor_llm::bench::model::table(model, &rows));
        if !tp.is_empty() {
            print!(
                "{}",
                webtensor_llm::bench::tensor_parallel::table(model, &tp_rows)
            );
        }
    }
    Ok(())
}

/// Prints a report (JSON or table) and writes `report.json` + `report.html` when asked.
fn publish(
    report: &bench::BenchReport,
    json: bool,
    dir: Option<&std::path::Path>,
) -> Result<(), Error> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).expect("the report serialises")
        );
    } else {
        print!("{}", bench::report::table(report));
    }
    if let Some(dir) = dir {
        crate::charts::write(report, dir)?;
        eprintln!(
            "wrote {} and {}",
            dir.join("report.json").display(),
            dir.join("report.html").display()
        );
    }
    Ok(())
}

/// `bench --merge`: one report from several machines' report.json files (and peers).
pub fn bench_merge(
    files: &[String],
    peers: &[String],
    dir: Option<&std::path::Path>,
    json: bool,
) -> Result<(), Error> {
    let reports = files
        .iter()
        .map(|f| bench::merge::load_report(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut report = bench::merge::merge(reports)?;
    for p in peers {
        report.peers.extend(bench::merge::load_peers(p)?);
    }
    publish(&report, json, dir)
}

pub fn bench(
    backends: &[String],
    ops: &[String],
    size: SizeArg,
    runs: u32,
    json: bool,
    dir: Option<&std::path::Path>,
    peers: &[String],
) -> Result<(), Error> {
    let backends = bench_backends(backends)?;
    let ops = ops
        .iter()
        .map(|n| {
            OpKind::parse(n).ok_or_else(|| Error::InvalidArgument {
                op: "bench",
                reason: format!(
                    "unknown op `{n}`; valid ops are: {}",
                    OpKind::ALL.map(|o| o.name()).join(", ")
                ),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let size = match size {
        SizeArg::Small => Size::Small,
        SizeArg::Medium => Size::Medium,
    };
    let config = BenchConfig {
        backends,
        ops,
        size,
        runs: runs as usize,
        options: webtensor::BackendOptions::from_env()?,
        ..BenchConfig::default()
    };
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = bench::run(&config, |done, total, label| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(label.to_string());
    })?;
    bar.finish_and_clear();
    let mut report = report;
    for p in peers {
        if p.is_empty() {
            // `--peers` with no file: numpy on the same shapes, now, on this machine.
            report.peers.extend(peer::numpy(&report)?);
        } else {
            report.peers.extend(bench::merge::load_peers(p)?);
        }
    }
    publish(&report, json, dir)?;
    if report.rows.iter().any(|r| r.failed()) {
        return Err(Error::Tool {
            part: "bench",
            message: "some rows did not match the reference (marked FAILED above)".into(),
        });
    }
    Ok(())
}
