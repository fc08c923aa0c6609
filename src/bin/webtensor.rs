//! `webtensor`: inspect backends and benchmark ops.
//!
//! ```text
//! webtensor info [--json]
//! webtensor bench [--backend B]... [--op OP]... [--size small|medium] [--runs N] [--json]
//!                 [--report DIR] [--peers peers.json]
//! webtensor bench --merge a.json b.json ... [--peers peers.json]... --report DIR
//! webtensor generate [--model PATH] [--prompt TEXT] [--chat [--system TEXT]] [--backend B]
//!                    [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//! webtensor chat [--model PATH] [--system TEXT] [--backend B] [--max-tokens N] [sampling]
//! webtensor eval [--model PATH] --tokens 1,5,9 [--backend B]
//! webtensor serve [--port P] [--dir CHECKOUT]
//! ```

#[path = "webtensor/chat.rs"]
mod chat;
#[path = "webtensor/peer.rs"]
mod peer;
#[path = "webtensor/serve.rs"]
mod serve;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use webtensor::backend::{registry, BackendInfo, BackendKind, OpKind};
use webtensor::bench::{self, BenchConfig, Size};
use webtensor::device::{Decision, PrioritySource};
use webtensor::model::{self, ActivationMode, Llama, ModelFiles, Sampling};
use webtensor::{Device, Error};

#[derive(Parser)]
#[command(
    name = "webtensor",
    version,
    about = "Tensor ops and LLM inference on every device: inspect backends, run benchmarks, generate text"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show every backend: present or why not, adapter, driver, features, limits, and what
    /// `Device::auto` picks.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Time every op on every present backend against ceilings measured in the same run.
    Bench {
        /// Backends to time (repeatable); default: every present one but `reference`.
        #[arg(long = "backend", value_name = "NAME")]
        backends: Vec<String>,
        /// Op families to time (repeatable), e.g. matmul, rms_norm; default: all.
        #[arg(long = "op", value_name = "NAME")]
        ops: Vec<String>,
        /// Problem sizes.
        #[arg(long, value_enum, default_value_t = SizeArg::Small)]
        size: SizeArg,
        /// Timed samples per row (the median is reported).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Time a model instead of the ops: a Hugging Face folder, a .gguf file, or `builtin`.
        /// Reports prefill and decode tokens/s and decode weight bytes/s against the copy
        /// bandwidth.
        #[arg(long, value_name = "PATH")]
        model: Option<String>,
        /// With --model: prompt tokens processed in one pass.
        #[arg(long, default_value_t = 64)]
        prompt_tokens: usize,
        /// With --model: tokens decoded (several steps per submit, as `generate` does).
        #[arg(long, default_value_t = 32)]
        decode_tokens: usize,
        /// With --model: activations of the linear layers: `int` (q8_0 for q8_0/q4_0
        /// weights, per-row i8 for ternary ones, as llama.cpp does) or `f32`.
        #[arg(long, value_name = "MODE", default_value = "int", value_parser = parse_activations)]
        activations: ActivationMode,
        /// With --model: also time decode with the model split over this many separate devices
        /// of each backend (comma-separated, e.g. 1,2,4), the all-reduce time broken out.
        #[arg(long, value_name = "SIZES", value_delimiter = ',')]
        tp: Vec<usize>,
        /// Also write report.json and a self-contained report.html with charts into DIR.
        #[arg(long, value_name = "DIR")]
        report: Option<std::path::PathBuf>,
        /// Merge these report.json files (from other machines) instead of timing anything.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        merge: Vec<String>,
        /// Peer timings from benches/peers.py to compare against (numpy, llama.cpp); repeatable.
        /// With --model and no FILE: time llama.cpp (llama-cpp-python) on the same GGUF after
        /// each of our samples (--runs of them) and print the ratio.
        #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "")]
        peers: Vec<String>,
    },
    /// Generate text from a prompt, streaming it, then print prompt and decode tokens/s.
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        /// The text to continue (with --chat: the user's message).
        #[arg(long, default_value = "In the beginning")]
        prompt: String,
        /// Send the prompt as a user message through the model's chat template and print the
        /// assistant's reply (it stops at the end of the turn).
        #[arg(long)]
        chat: bool,
        /// With --chat: a system message first.
        #[arg(long, value_name = "TEXT", requires = "chat")]
        system: Option<String>,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Chat with an instruction-tuned model through its chat template: each line of standard
    /// input is a user message and the reply streams back; `/reset` starts a new
    /// conversation, `/exit` (or the end of the input) ends it.
    Chat {
        #[command(flatten)]
        model: ModelArgs,
        /// A system message at the start of the conversation.
        #[arg(long, value_name = "TEXT")]
        system: Option<String>,
        /// Most tokens per reply.
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Print the logits of every position of a token sequence as JSON (an array of arrays).
    Eval {
        #[command(flatten)]
        model: ModelArgs,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
    },
    /// Serve the browser demo (demo/ and web/pkg, built by ./web/build.sh) on 127.0.0.1 with
    /// cross-origin isolation headers, and print its address.
    Serve {
        /// Port to listen on (0: any free port).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// The webtensor checkout holding demo/ and web/pkg.
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: std::path::PathBuf,
    },
}

/// Where the model comes from and where it runs.
#[derive(clap::Args)]
struct ModelArgs {
    /// A Hugging Face model folder or a .gguf file; default: the built-in tiny model.
    #[arg(long, value_name = "PATH")]
    model: Option<std::path::PathBuf>,
    /// Backend to run on (cpu, wgpu, reference, cuda); default: `Device::auto`.
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Keep only this many decoder layers on the device and stream the others from the
    /// (memory-mapped) files on every forward pass: for models larger than the device.
    #[arg(long, value_name = "N")]
    resident_layers: Option<usize>,
    /// Split the model over N separate devices of the backend (tensor parallel: heads and FFN
    /// columns per device, partial sums added through the host).
    #[arg(long, value_name = "N", default_value_t = 1)]
    tp: usize,
    /// Activations of the linear layers: `int` (q8_0 for q8_0/q4_0 weights, per-row i8 for
    /// ternary ones, as llama.cpp does) or `f32` (the stored weights' exact products).
    #[arg(long, value_name = "MODE", default_value = "int", value_parser = parse_activations)]
    activations: ActivationMode,
}

fn parse_activations(value: &str) -> Result<ActivationMode, String> {
    ActivationMode::parse(value).map_err(|e| e.to_string())
}

/// How tokens are drawn.
#[derive(clap::Args)]
struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Keep the most likely tokens up to this total probability.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    fn sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum SizeArg {
    Small,
    Medium,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { json } => info(json),
        Command::Bench {
            backends,
            model: Some(model),
            prompt_tokens,
            decode_tokens,
            activations,
            runs,
            peers,
            json,
            tp,
            ..
        } => bench_model(
            &backends,
            &model,
            (prompt_tokens, decode_tokens),
            activations,
            (runs as usize, &peers, &tp),
            json,
        ),
        Command::Bench {
            merge,
            peers,
            report,
            json,
            model: None,
            ..
        } if !merge.is_empty() => bench_merge(&merge, &peers, report.as_deref(), json),
        Command::Bench {
            backends,
            ops,
            size,
            runs,
            json,
            model: None,
            report,
            peers,
            ..
        } => bench(&backends, &ops, size, runs, json, report.as_deref(), &peers),
        Command::Generate {
            model,
            prompt,
            chat: false,
            max_tokens,
            sampling,
            ..
        } => generate(&model, &prompt, max_tokens, sampling.sampling()),
        Command::Generate {
            model,
            prompt,
            system,
            max_tokens,
            sampling,
            ..
        } => chat::once(
            &model,
            system.as_deref(),
            &prompt,
            max_tokens,
            sampling.sampling(),
        ),
        Command::Chat {
            model,
            system,
            max_tokens,
            sampling,
        } => chat::interactive(&model, system.as_deref(), max_tokens, sampling.sampling()),
        Command::Eval { model, tokens } => eval(&model, &tokens),
        Command::Serve { port, dir } => serve::run(&dir, port).map_err(|source| Error::Io {
            path: dir.display().to_string(),
            source,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

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

fn info(json: bool) -> Result<(), Error> {
    let backends = BackendKind::ALL
        .into_iter()
        .map(|kind| match registry::get(kind) {
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

fn bytes(v: u64) -> String {
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

fn bench_model(
    backends: &[String],
    model: &str,
    (prompt_tokens, decode_tokens): (usize, usize),
    activations: ActivationMode,
    (runs, peers, tp): (usize, &[String], &[usize]),
    json: bool,
) -> Result<(), Error> {
    let backends = bench_backends(backends)?;
    let open = || -> Result<ModelFiles, Error> {
        if model == "builtin" {
            model::builtin::files()
        } else {
            ModelFiles::open(std::path::Path::new(model))
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
    let path = std::path::Path::new(model);
    if with_llama_cpp && path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Err(Error::InvalidArgument {
            op: "bench",
            reason: format!("--peers runs llama.cpp, which needs a .gguf file; {model} is not one"),
        });
    }
    let threads = rayon::current_num_threads();
    let llama_cpp = |p: usize, d: usize| peer::llama_cpp(path, threads, p, d);
    let peer: Option<&dyn Fn(usize, usize) -> Result<bench::model::PeerSample, Error>> =
        with_llama_cpp.then_some(&llama_cpp);
    let tokens = (prompt_tokens, decode_tokens);
    let rows = bench::model::run(&open, &backends, tokens, activations, runs, peer, |step| {
        eprintln!("{step}")
    })?;
    let tp_rows = if tp.is_empty() {
        Vec::new()
    } else {
        bench::parallel::run(&open, &backends, tp, tokens, activations, runs, |step| {
            eprintln!("{step}")
        })?
    };
    if json {
        let value = if tp.is_empty() {
            serde_json::to_value(&rows)
        } else {
            serde_json::to_value(serde_json::json!({ "rows": rows, "tp": tp_rows }))
        };
        let text = value
            .and_then(|v| serde_json::to_string_pretty(&v))
            .map_err(|e| Error::Backend {
                backend: "cli".into(),
                message: e.to_string(),
            })?;
        println!("{text}");
    } else {
        print!("{}", bench::model::table(model, &rows));
        if !tp.is_empty() {
            print!("{}", bench::parallel::table(model, &tp_rows));
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
        bench::html::write(report, dir)?;
        eprintln!(
            "wrote {} and {}",
            dir.join("report.json").display(),
            dir.join("report.html").display()
        );
    }
    Ok(())
}

/// `bench --merge`: one report from several machines' report.json files (and peers).
fn bench_merge(
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

fn bench(
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
        report.peers.extend(bench::merge::load_peers(p)?);
    }
    publish(&report, json, dir)?;
    if report.rows.iter().any(|r| !r.checked) {
        return Err(Error::Backend {
            backend: "bench".into(),
            message: "some rows did not match the reference (marked FAILED above)".into(),
        });
    }
    Ok(())
}

/// Opens the model (or the built-in one) on the chosen device.
fn load(args: &ModelArgs) -> Result<(Llama, String), Error> {
    let device = match &args.backend {
        Some(name) => Device::new(name)?,
        None => Device::auto()?,
    };
    let (files, name) = match &args.model {
        Some(path) => (ModelFiles::open(path)?, path.display().to_string()),
        None => (model::builtin::files()?, model::builtin::NAME.to_string()),
    };
    let mut model = match (args.tp, args.resident_layers) {
        (1, resident) => Llama::load_streaming(&device, files, resident.unwrap_or(usize::MAX))?,
        (_, Some(_)) => {
            return Err(Error::InvalidArgument {
                op: "load",
                reason: "--resident-layers does not combine with --tp; split over more devices \
                         instead"
                    .into(),
            })
        }
        (size, None) => {
            let devices = model::parallel::devices_of(device.chain()[0], size)?;
            Llama::load_parallel(&devices, files, model::TpConfig { size })?
        }
    };
    model.set_activations(args.activations);
    eprintln!(
        "{name}: {} layers, {} hidden, vocab {} on {}; {}",
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.config.vocab_size,
        match args.tp {
            1 => device.backend_name().to_string(),
            n => format!("{n} {} devices", device.backend_name()),
        },
        model.activation_path()
    );
    Ok((model, name))
}

fn generate(
    args: &ModelArgs,
    prompt: &str,
    max_tokens: usize,
    sampling: Sampling,
) -> Result<(), Error> {
    use std::io::Write;
    let (llama, tokenizer) = load_with_tokenizer(args)?;
    let mut out = std::io::stdout();
    print!("{prompt}");
    let stats = model::generate(&llama, &tokenizer, prompt, max_tokens, sampling, |text| {
        print!("{text}");
        let _ = out.flush();
    })?;
    println!();
    report(&stats);
    Ok(())
}

/// Opens the model and its tokenizer.
fn load_with_tokenizer(args: &ModelArgs) -> Result<(Llama, model::Tokenizer), Error> {
    let (llama, name) = load(args)?;
    let tokenizer = llama.tokenizer.clone().ok_or_else(|| Error::ModelFile {
        path: name,
        reason: "the model has no tokenizer (tokenizer.json or GGUF vocabulary)".into(),
    })?;
    Ok((llama, tokenizer))
}

/// Prints a generation's speed to standard error.
fn report(stats: &model::GenerationStats) {
    eprintln!(
        "prompt: {} tokens, {:.1} tokens/s; decode: {} tokens, {:.1} tokens/s{}",
        stats.prompt_tokens,
        stats.prompt_tokens_per_sec(),
        stats.generated_tokens,
        stats.decode_tokens_per_sec(),
        if stats.stopped_at_eos {
            " (stopped at end of sequence)"
        } else {
            ""
        }
    );
}

fn eval(args: &ModelArgs, tokens: &[u32]) -> Result<(), Error> {
    let (llama, _) = load(args)?;
    let logits: Vec<f32> = llama.logits(tokens)?.to_vec()?;
    let rows: Vec<&[f32]> = logits.chunks(llama.config.vocab_size).collect();
    println!(
        "{}",
        serde_json::to_string(&rows).map_err(|e| Error::Backend {
            backend: "cli".into(),
            message: e.to_string(),
        })?
    );
    Ok(())
}
