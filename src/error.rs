//! The one error type of webtensor.
//!
//! Every fallible call returns [`Result`]. Variants carry structured fields (op name, shapes,
//! limits) so callers can react to them, and their messages say what was wrong and what to do.
//! Nothing in the library panics on user input; a panic is a bug.

use crate::backend::kind::BackendKind;
use crate::dtype::DType;
use crate::shape::Shape;

/// Shorthand for `std::result::Result<T, webtensor::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in webtensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The shapes given to an op do not fit together.
    #[error("{op}: shape mismatch: {reason} (got {shapes})")]
    ShapeMismatch {
        /// The op that refused its inputs.
        op: &'static str,
        /// What the op needed.
        reason: String,
        /// The shapes it was given, in argument order.
        shapes: String,
    },

    /// A tensor has a dtype the op does not accept.
    #[error("{op}: expected a {expected} tensor for `{argument}`, got {got}")]
    DTypeMismatch {
        /// The op that refused its input.
        op: &'static str,
        /// The argument name.
        argument: &'static str,
        /// The dtype the op needs.
        expected: DType,
        /// The dtype it was given.
        got: DType,
    },

    /// A scalar argument is out of range (an axis, an epsilon, a permutation, an index).
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The op that refused the argument.
        op: &'static str,
        /// What was wrong and what is allowed.
        reason: String,
    },

    /// The number of elements given does not match the shape.
    #[error("data has {len} elements but shape {shape} needs {expected}")]
    DataLength {
        /// Elements given.
        len: usize,
        /// Elements the shape needs.
        expected: usize,
        /// The shape asked for.
        shape: Shape,
    },

    /// Tensors from two different devices were combined.
    #[error("{op}: tensors live on different devices ({first} and {second}); move one with Tensor::to_device")]
    DeviceMismatch {
        /// The op that received them.
        op: &'static str,
        /// The first device, as its backend chain (`Device(wgpu → cpu)`): a device, not a
        /// backend, since two devices may share one backend kind.
        first: String,
        /// The second device, as its backend chain.
        second: String,
    },

    /// A backend name that webtensor does not know.
    #[error("unknown backend `{name}`; valid names are: {valid}")]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// Comma-separated valid names.
        valid: String,
    },

    /// A known backend that cannot run here.
    #[error("backend `{backend}` is not available: {reason}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: BackendKind,
        /// Why it is missing (not compiled in, no adapter, no driver).
        reason: String,
    },

    /// No backend in the priority list could be started.
    #[error(
        "no backend in the priority list [{}] is available: {reasons}",
        kinds_text(priority)
    )]
    NoBackend {
        /// The priority list that was tried.
        priority: Vec<BackendKind>,
        /// Why each one failed.
        reasons: String,
    },

    /// A tensor does not fit a device limit.
    #[error(
        "{op}: a buffer of {bytes} bytes exceeds the {backend} device's {limit_name} of {limit} bytes; \
         split the tensor, or run this op on the cpu backend"
    )]
    TensorTooLarge {
        /// The op (or "upload") that needed the buffer.
        op: &'static str,
        /// The backend whose limit was hit.
        backend: BackendKind,
        /// The buffer size needed.
        bytes: u64,
        /// Which limit was hit.
        limit_name: &'static str,
        /// The limit itself.
        limit: u64,
    },

    /// The configuration file or environment could not be used.
    #[error("configuration error in {source_name}: {reason}")]
    Config {
        /// The file path or environment variable.
        source_name: String,
        /// What was wrong.
        reason: String,
    },

    /// A backend failed while running work (driver error, lost device, failed readback).
    #[error("{backend} backend failure: {message}")]
    Backend {
        /// The failing backend.
        backend: BackendKind,
        /// The message from the driver or runtime.
        message: String,
    },

    /// A part of the command-line tool outside every backend failed: writing JSON, the API
    /// server's engine thread, a peer benchmark script, a bench row that disagreed with the
    /// reference.
    #[error("{part}: {message}")]
    Tool {
        /// The part that failed (`bench`, `serve`, `llama.cpp peer`, ...).
        part: &'static str,
        /// What went wrong.
        message: String,
    },

    /// A model file is truncated, corrupted or inconsistent (offsets, sizes, dtypes, shapes,
    /// missing tensors), or of a kind webtensor cannot load.
    #[error("{path}: {reason}")]
    ModelFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A KV cache has no room for more tokens.
    #[error(
        "the KV cache is full: it holds {len} of {capacity} tokens and {requested} more were \
         given; reset it or create it with a larger capacity (at most the model's context)"
    )]
    CacheFull {
        /// Tokens it can hold.
        capacity: usize,
        /// Tokens it holds.
        len: usize,
        /// Tokens that did not fit.
        requested: usize,
    },

    /// A paged KV cache's pool has too few free blocks for the tokens given.
    #[error(
        "the paged KV cache has {free} free blocks of {block_size} tokens and {needed} more are \
         needed; end or reset a sequence to free its blocks, or give the cache a larger memory \
         budget"
    )]
    CacheBlocksExhausted {
        /// Tokens per block.
        block_size: usize,
        /// Blocks no sequence holds.
        free: usize,
        /// Blocks the tokens needed.
        needed: usize,
    },

    /// Memory for something could not be had: more than the device or host has available, or
    /// an allocation the system refused.
    #[error("{what} needs {} but {}; {hint}", bytes_text(*.bytes), available_text(*.available))]
    OutOfMemory {
        /// What needed the memory.
        what: String,
        /// Bytes asked for.
        bytes: u64,
        /// Bytes available, where known.
        available: Option<u64>,
        /// What to do instead.
        hint: String,
    },

    /// A device ran out of memory while allocating (reported by the driver, after the fact).
    #[error(
        "the {backend} device ran out of memory ({message}); keep fewer layers on the device \
         (--resident-layers N, Llama::load_streaming), use a shorter context or a smaller or \
         more quantized model, or run on the cpu backend"
    )]
    DeviceOutOfMemory {
        /// The backend.
        backend: BackendKind,
        /// The driver's message.
        message: String,
    },

    /// The device was lost (driver reset or crash, GPU removed); nothing on it can be used.
    #[error(
        "the {backend} device was lost ({message}); its tensors are gone: create a new Device \
         (or run on the cpu backend) and load the model again"
    )]
    DeviceLost {
        /// The backend.
        backend: BackendKind,
        /// The driver's message.
        message: String,
    },

    /// A tensor-parallel size that does not split the model evenly.
    #[error(
        "a tensor-parallel size of {size} does not divide the model's {count} {what}; use a tp \
         size that divides the attention heads, the key/value heads and the FFN width"
    )]
    TpIndivisible {
        /// The tp size asked for.
        size: usize,
        /// What it must divide.
        what: String,
        /// How many of them the model has.
        count: usize,
    },

    /// The devices given for tensor parallelism cannot run the split together.
    #[error("tensor parallelism over {size} ranks: {reason}")]
    TpDevices {
        /// The tp size asked for.
        size: usize,
        /// What is wrong with the devices and what to do.
        reason: String,
    },

    /// One rank of a tensor-parallel model failed during a pass (its device was lost, ran out
    /// of memory, or a readback failed).
    #[error(
        "tensor-parallel rank {rank} ({backend}) failed during a pass: {source}; the other ranks' \
         caches no longer match it: reset every sequence, or load the model again without that \
         device"
    )]
    ShardFailed {
        /// The rank.
        rank: usize,
        /// Its device's primary backend.
        backend: BackendKind,
        /// The rank's own error.
        source: Box<Error>,
    },

    /// A product of a block format the backend runs, but not with these activations (wgpu's
    /// group-decoded formats take f32 ones and llama.cpp's rounding for them: `Q8_K` for the
    /// super-blocks, `Q8_0` for the legacy `Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL`, which the engine
    /// gives them, `ActivationMode::for_weight`).
    #[error(
        "the {backend} backend has no product of {weight} weights with {activations} \
         activations; give it f32 activations or llama.cpp's rounding for the format (the \
         engine does: ActivationMode::for_weight)"
    )]
    ActivationsUnsupported {
        /// The weights' block format.
        weight: DType,
        /// The activations asked for, by name.
        activations: String,
        /// The backend without the product.
        backend: BackendKind,
    },

    /// A model tensor is larger than one buffer of the device can be.
    #[error(
        "tensor `{tensor}` needs a buffer of {bytes} bytes, beyond the {backend} device's \
         {limit_name} of {limit} bytes; run the model on the cpu backend (--backend cpu), or use \
         a more quantized model"
    )]
    WeightTooLarge {
        /// The tensor's name in the model files.
        tensor: String,
        /// The backend whose limit was hit.
        backend: BackendKind,
        /// The buffer size needed.
        bytes: u64,
        /// Which limit was hit.
        limit_name: &'static str,
        /// The limit itself.
        limit: u64,
    },

    /// A chat template went past a bound of its render ([`TemplateBound`]). A template
    /// comes from the model's files (or `--chat-template`) and is input like its tensors: it
    /// may loop for minutes or double a string until memory runs out, so its work and its
    /// output are bounded by the context the prompt must fit.
    #[error(
        "the chat template from {template} went past {bound}: the conversation is too long for \
         the context, or the template loops or grows text without end; shorten the \
         conversation, or give the model another template (--chat-template FILE)"
    )]
    TemplateLimit {
        /// Where the template came from (`tokenizer_config.json`, a GGUF file's key, a file).
        template: String,
        /// The bound it went past.
        bound: TemplateBound,
    },

    /// A chat template ended the process that rendered it, in a way minijinja's fuel does not
    /// bound (a list doubled with `+` past memory, a value nested in itself and printed past
    /// the stack). Only a renderer that runs templates in a process of its own (the
    /// `webtensor` command's) survives to report this; the template is the one to blame.
    #[error(
        "the chat template from {template} ended the process that rendered it ({reason}): it \
         grows a list or nests a value in itself without end; give the model another template \
         (--chat-template FILE)"
    )]
    TemplateAborted {
        /// Where the template came from.
        template: String,
        /// How the render process ended, with what it wrote on stderr.
        reason: String,
    },

    /// A pattern of the model's tokenizer (a `Split` pre-tokenizer, a `Replace` normalizer)
    /// backtracked past its bound on a text: such a pattern is input from the tokenizer file,
    /// and one that backtracks without end would otherwise hang the encode.
    #[error(
        "the tokenizer pattern {pattern:?} went past its bound of {limit} backtracking steps on \
         this text; the tokenizer file's pattern backtracks without end on it: fix the pattern, \
         or shorten runs of repeated characters in the text"
    )]
    PatternLimit {
        /// The pattern, as the tokenizer file writes it.
        pattern: String,
        /// Backtracking steps one match may take.
        limit: usize,
    },

    /// An I/O error with the path that caused it.
    #[error("{path}: {source}")]
    Io {
        /// The file that could not be read or written.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The bounds of a chat template's render, as [`Error::TemplateLimit`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TemplateBound {
    /// Its fuel: minijinja's budget, one fuel per instruction and one per 64 bytes of text
    /// or list it makes, visits or writes (so that it also bounds memory).
    Fuel {
        /// The fuel of the render.
        fuel: u64,
    },
    /// The text it may write: `bytes_per_token` for each token of the context.
    Output {
        /// The most bytes.
        bytes: usize,
        /// The context's tokens.
        context: usize,
        /// Bytes allowed per token.
        bytes_per_token: usize,
    },
}

impl std::fmt::Display for TemplateBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateBound::Fuel { fuel } => write!(
                f,
                "its budget of {fuel} fuel (one per instruction, one per 64 bytes of text it makes)"
            ),
            TemplateBound::Output {
                bytes,
                context,
                bytes_per_token,
            } => write!(
                f,
                "its output limit of {bytes} bytes ({bytes_per_token} for each of the context's \
                 {context} tokens)"
            ),
        }
    }
}

/// Backend names joined by commas, as a priority list is written.
fn kinds_text(kinds: &[BackendKind]) -> String {
    kinds
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A byte count for messages: exact, with a binary unit where it helps.
fn bytes_text(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= GIB {
        format!("{bytes} bytes ({:.1} GiB)", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{bytes} bytes ({:.1} MiB)", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

fn available_text(available: Option<u64>) -> String {
    match available {
        Some(a) => format!("{} are available", bytes_text(a)),
        None => "the allocation was refused".into(),
    }
}

impl Error {
    pub(crate) fn shape(op: &'static str, reason: impl Into<String>, shapes: &[&Shape]) -> Self {
        let shapes = shapes
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        Error::ShapeMismatch {
            op,
            reason: reason.into(),
            shapes,
        }
    }

    /// An invalid argument to `op`, and why.
    pub fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            reason: reason.into(),
        }
    }

    /// A configuration error: `field` of the file `source` is wrong, and `why`.
    pub fn config_field(source: &str, field: &str, why: String) -> Self {
        Error::Config {
            source_name: source.to_string(),
            reason: format!("`{field}` {why}"),
        }
    }

    /// A model file at `path` that cannot be used, and why.
    pub fn model_file(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::ModelFile {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn backend(backend: BackendKind, message: impl Into<String>) -> Self {
        Error::Backend {
            backend,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backend identities are `BackendKind`s now; the messages read as they did when they
    /// were strings.
    #[test]
    fn backend_kinds_display_as_their_names() {
        let failure = Error::backend(BackendKind::Wgpu, "mapping the readback failed");
        assert_eq!(
            failure.to_string(),
            "wgpu backend failure: mapping the readback failed"
        );
        let none = Error::NoBackend {
            priority: vec![BackendKind::Cuda, BackendKind::Cpu],
            reasons: "cuda: no driver".into(),
        };
        assert_eq!(
            none.to_string(),
            "no backend in the priority list [cuda, cpu] is available: cuda: no driver"
        );
        let lost = Error::DeviceLost {
            backend: BackendKind::Cuda,
            message: "Xid 79".into(),
        };
        assert!(lost
            .to_string()
            .starts_with("the cuda device was lost (Xid 79)"));
    }
}
