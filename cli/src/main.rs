//! `webtensor`: inspect backends, benchmark ops and models, and run models: generate, chat,
//! and an OpenAI-compatible server.
//!
//! ```text
//! webtensor info [--json]
//! webtensor bench [--backend B]... [--op OP]... [--size small|medium] [--runs N] [--json]
//!                 [--report DIR] [--peers [peers.json]]
//! webtensor bench --merge a.json b.json ... [--peers peers.json]... --report DIR
//! webtensor generate [--model PATH] [--prompt TEXT] [--chat [--system TEXT]] [--backend B]
//!                    [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//! webtensor chat [--model PATH] [--system TEXT] [--backend B] [--max-tokens N] [sampling]
//! webtensor eval [--model PATH] --tokens 1,5,9 [--backend B]
//! webtensor models [--json]
//! webtensor serve [--port P] [--dir CHECKOUT] [--model PATH [--max-sequences N]]
//! ```
//!
//! Every command that runs a model also takes `--threads N` (the cpu backend's pool) and
//! `--ctx N` (a shorter context than the model's, to bound cache memory). `--model` takes a
//! path, `builtin`, or the name of a model in the cache folder `webtensor models` lists.

mod bench_cmd;
mod charts;
mod chat;
mod info;
mod models;
mod peer;
mod serve;
mod template_worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use webtensor::{Device, Error};
use webtensor_llm::{ActivationMode, Llama, ModelFiles, Sampling};

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
        /// With --model: activations of the linear layers: `int` (as llama.cpp rounds them:
        /// q8_0 for the 32-value formats, q8_k for the K-quants and iq4_xs, per-row i8 for
        /// ternary weights) or `f32`.
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
        /// With no FILE: time the peer now and print the ratio: for op rows, numpy on the
        /// same shapes right after our rows; with --model, llama.cpp (llama-cpp-python) on
        /// the same GGUF after each of our samples (--runs of them).
        #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "")]
        peers: Vec<String>,
        /// Threads of the cpu backend (default: one per logical core).
        #[arg(long, value_name = "N", value_parser = parse_threads)]
        threads: Option<usize>,
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
        /// With --chat: render with this Jinja chat template instead of the model's own.
        #[arg(long, value_name = "FILE", requires = "chat")]
        chat_template: Option<std::path::PathBuf>,
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
        /// Render with this Jinja chat template instead of the model's own.
        #[arg(long, value_name = "FILE")]
        chat_template: Option<std::path::PathBuf>,
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
    /// List the models in the cache folder (`$WEBTENSOR_MODELS`, else
    /// `$XDG_CACHE_HOME/webtensor/models`, else `~/.cache/webtensor/models`) and their sizes;
    /// `--model NAME` finds them there.
    Models {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Render chat templates for another webtensor process, one JSON request per line of
    /// stdin (internal: the worker of `template_worker.rs`).
    #[command(name = "template-worker", hide = true)]
    TemplateWorker,
    /// Serve the browser demo (demo/ and web/pkg, built by ./web/build.sh) on 127.0.0.1 with
    /// cross-origin isolation headers, and print its address. With --model, also an
    /// OpenAI-compatible API: /v1/chat/completions, /v1/completions (streamed with
    /// `"stream": true`) and /v1/models, concurrent requests decoded in one batch. /health and
    /// /metrics (Prometheus text format) report the server; each request logs one line on
    /// stderr with its timings.
    Serve {
        /// Port to listen on (0: any free port).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// The webtensor checkout holding demo/ and web/pkg.
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: std::path::PathBuf,
        #[command(flatten)]
        model: ModelArgs,
        /// With --model: requests generated at the same time (each a sequence of the paged
        /// cache, which holds this many full contexts); requests beyond them wait in line.
        #[arg(long, value_name = "N", default_value_t = 16,
              value_parser = clap::value_parser!(u16).range(1..=256))]
        max_sequences: u16,
        /// With --model: requests that may wait for a sequence, served in the order they
        /// came; a request that finds the line full gets a 503 with Retry-After.
        #[arg(long, value_name = "N", default_value_t = 64,
              value_parser = clap::value_parser!(u16).range(0..=1024))]
        queue: u16,
        /// With --model: render /v1/chat/completions with this Jinja chat template instead
        /// of the model's own.
        #[arg(long, value_name = "FILE", requires = "model")]
        chat_template: Option<std::path::PathBuf>,
    },
}

/// Where the model comes from and where it runs.
#[derive(clap::Args)]
struct ModelArgs {
    /// A Hugging Face model folder or a .gguf file, `builtin`, or the name of a model in the
    /// cache folder (see `webtensor models`); default: the built-in tiny model.
    #[arg(long, value_name = "PATH")]
    model: Option<std::path::PathBuf>,
    /// Threads of the cpu backend (default: one per logical core).
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    threads: Option<usize>,
    /// Tokens of context: caches and prompts are bounded by it (default and most: the
    /// model's own context).
    #[arg(long, value_name = "N", value_parser = parse_ctx)]
    ctx: Option<usize>,
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
    /// Activations of the linear layers: `int` (as llama.cpp rounds them: q8_0 for the 32-value
    /// formats, q8_k for the K-quants and iq4_xs, per-row i8 for ternary weights; f32 for f32,
    /// f16 and bf16 weights) or `f32` (the stored weights' exact products).
    #[arg(long, value_name = "MODE", default_value = "int", value_parser = parse_activations)]
    activations: ActivationMode,
}

fn parse_activations(value: &str) -> Result<ActivationMode, String> {
    ActivationMode::parse(value).map_err(|e| e.to_string())
}

/// Most threads `--threads` takes: far beyond any core count, short of exhausting the process.
const MAX_THREADS: usize = 1024;

fn parse_threads(value: &str) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "a thread count from 1 to {MAX_THREADS} (this machine has {cores} logical cores)"
        )),
    }
}

fn parse_ctx(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("a positive number of tokens (at most the model's own context)".into()),
    }
}

/// Sizes the cpu backend's pool (rayon's global pool) before anything starts it.
fn set_threads(threads: Option<usize>) -> Result<(), Error> {
    let Some(n) = threads else { return Ok(()) };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| Error::InvalidArgument {
            op: "--threads",
            reason: format!("the cpu pool could not take {n} threads: {e}"),
        })
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

/// Keeps Mesa's Vulkan drivers from printing "error: XDG_RUNTIME_DIR is invalid or not set in
/// the environment." (twice) when wgpu lists adapters, which tells a newcomer something failed
/// when nothing did. The line comes from libwayland: Mesa's device-select layer
/// (`VK_LAYER_MESA_device_select`, an implicit Vulkan layer) asks the Wayland compositor which
/// GPU drives the display, so that GPU can be listed first, and libwayland cannot even look for
/// a compositor without `XDG_RUNTIME_DIR`. With no `XDG_RUNTIME_DIR` (and no absolute
/// `WAYLAND_DISPLAY`) there is no compositor to ask, so the layer has nothing to learn, and
/// webtensor orders adapters itself anyway: the layer is switched off through its own switch,
/// `NODEVICE_SELECT`, for this process. A user who set `NODEVICE_SELECT` or
/// `MESA_VK_DEVICE_SELECT` keeps their choice. Runs first in `main`, before any thread starts.
fn quiet_mesa_without_a_session() {
    let set = |name: &str| std::env::var_os(name).is_some();
    let absolute =
        |name: &str| std::env::var_os(name).is_some_and(|v| std::path::Path::new(&v).is_absolute());
    let session = absolute("XDG_RUNTIME_DIR") || absolute("WAYLAND_DISPLAY");
    if !session && !set("NODEVICE_SELECT") && !set("MESA_VK_DEVICE_SELECT") {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

fn main() -> ExitCode {
    quiet_mesa_without_a_session();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Bench { threads, .. } => *threads,
        Command::Generate { model, .. }
        | Command::Chat { model, .. }
        | Command::Eval { model, .. }
        | Command::Serve { model, .. } => model.threads,
        Command::Info { .. } | Command::Models { .. } | Command::TemplateWorker => None,
    };
    if let Err(e) = set_threads(threads) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Info { json } => info::info(json),
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
        } => bench_cmd::bench_model(
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
        } if !merge.is_empty() => bench_cmd::bench_merge(&merge, &peers, report.as_deref(), json),
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
        } => bench_cmd::bench(&backends, &ops, size, runs, json, report.as_deref(), &peers),
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
            chat_template,
            max_tokens,
            sampling,
            ..
        } => chat::once(
            &model,
            chat_template.as_deref(),
            system.as_deref(),
            &prompt,
            max_tokens,
            sampling.sampling(),
        ),
        Command::Chat {
            model,
            system,
            chat_template,
            max_tokens,
            sampling,
        } => chat::interactive(
            &model,
            chat_template.as_deref(),
            system.as_deref(),
            max_tokens,
            sampling.sampling(),
        ),
        Command::Eval { model, tokens } => eval(&model, &tokens),
        Command::Models { json } => models::list(json),
        Command::TemplateWorker => template_worker::serve(),
        Command::Serve {
            port,
            dir,
            model,
            max_sequences,
            queue,
            chat_template,
        } => serve_command(
            &dir,
            port,
            &model,
            chat_template.as_deref(),
            (max_sequences.into(), queue.into()),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `webtensor serve`: the demo, and with `--model` the OpenAI-compatible API.
fn serve_command(
    dir: &std::path::Path,
    port: u16,
    args: &ModelArgs,
    chat_template: Option<&std::path::Path>,
    (max_sequences, queue): (usize, usize),
) -> Result<(), Error> {
    let api = match &args.model {
        Some(path) => {
            let (llama, tokenizer) = chat::load(args, chat_template)?;
            let name = models::display_name(path);
            Some(serve::api::Api::start(
                llama,
                tokenizer,
                name,
                max_sequences,
                queue,
            )?)
        }
        None => None,
    };
    serve::run(dir, port, api)
}

/// Places `files` whole on `device`, with a progress bar of the layers on a terminal: a large
/// model's upload takes from seconds to minutes.
fn load_with_bar(device: &Device, files: ModelFiles) -> Result<Llama, Error> {
    use std::io::IsTerminal;
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {bar:30} {pos}/{len}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let model = Llama::load_with_progress(device, files, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    model
}

/// Opens the model (or the built-in one) on the chosen device.
fn load(args: &ModelArgs) -> Result<(Llama, String), Error> {
    let device = match &args.backend {
        Some(name) => Device::with_options(name, webtensor::BackendOptions::from_env()?)?,
        None => Device::auto()?,
    };
    let (files, name) = match &args.model {
        Some(path) => match models::resolve(path)? {
            Some(path) => (ModelFiles::open(&path)?, path.display().to_string()),
            None => (
                webtensor_llm::builtin::files()?,
                webtensor_llm::builtin::NAME.to_string(),
            ),
        },
        None => (
            webtensor_llm::builtin::files()?,
            webtensor_llm::builtin::NAME.to_string(),
        ),
    };
    let mut model = match (args.tp, args.resident_layers) {
        (1, None) => load_with_bar(&device, files)?,
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
            let devices = webtensor_llm::tensor_parallel::devices_of(
                device.chain()[0],
                size,
                device.options(),
            )?;
            Llama::load_parallel(&devices, files, webtensor_llm::TpConfig { size })?
        }
    };
    model.set_activations(args.activations);
    if let Some(ctx) = args.ctx {
        model.config.limit_context(ctx)?;
    }
    eprintln!(
        "{name}: {} layers, {} hidden, vocab {}, context {} on {}{}; {}",
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.config.vocab_size,
        model.config.context_len(),
        match args.tp {
            1 => device.backend_name().to_string(),
            n => format!("{n} {} devices", device.backend_name()),
        },
        if device.backend_name() == "cpu" {
            format!(" ({} threads)", rayon::current_num_threads())
        } else {
            String::new()
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
    let stats =
        webtensor_llm::generate(&llama, &tokenizer, prompt, max_tokens, sampling, |text| {
            print!("{text}");
            let _ = out.flush();
        })?;
    println!();
    report(&stats);
    Ok(())
}

/// Opens the model and its tokenizer, whose chat templates render in a worker process.
fn load_with_tokenizer(args: &ModelArgs) -> Result<(Llama, webtensor_llm::Tokenizer), Error> {
    let (llama, name) = load(args)?;
    let mut tokenizer = llama.tokenizer.clone().ok_or_else(|| Error::ModelFile {
        path: name,
        reason: "the model has no tokenizer (tokenizer.json or GGUF vocabulary)".into(),
    })?;
    // A chat template comes from the model's files: it is rendered in a worker process, which
    // is all it can end (template_worker.rs).
    tokenizer.set_template_renderer(Some(std::sync::Arc::new(
        template_worker::TemplateWorker::new()?,
    )));
    Ok((llama, tokenizer))
}

/// Prints a generation's speed to standard error.
fn report(stats: &webtensor_llm::GenerationStats) {
    let kept = match stats.prompt_tokens_reused {
        0 => String::new(),
        n => format!(" ({n} kept from the last turn)"),
    };
    eprintln!(
        "prompt: {} tokens{kept}, {:.1} tokens/s, first token after {:.3} s; decode: {} tokens, \
         {:.1} tokens/s{}",
        stats.prompt_tokens,
        stats.prompt_tokens_per_sec(),
        stats.prompt_secs,
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
        serde_json::to_string(&rows).map_err(|e| Error::Tool {
            part: "cli",
            message: e.to_string(),
        })?
    );
    Ok(())
}
