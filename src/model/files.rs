//! Opening model files: a Hugging Face folder (`config.json`, `model.safetensors` or shards
//! listed in `model.safetensors.index.json`, `tokenizer.json`) or a single GGUF file. Files
//! are memory-mapped on native targets, so weights go from the page cache to the device
//! without a second full copy in memory.

use std::collections::BTreeMap;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

use super::gguf::{self, Gguf, GgufValue};
use super::safetensors;
use super::weights::RawTensor;
use super::{LlamaConfig, Tokenizer};
use crate::backend::RopeLayout;
use crate::error::{Error, Result};

/// The bytes of one file: memory-mapped natively, owned otherwise.
pub enum FileBytes {
    /// A read-only memory map.
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    /// Bytes in memory (the browser, or tests).
    Owned(Vec<u8>),
}

impl FileBytes {
    /// The contents.
    pub fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }

    /// Maps `path` read-only.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn map(path: &Path) -> Result<FileBytes> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap-based loader, this assumes the file is
        // not truncated by another process while the model is loaded.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(FileBytes::Mapped(map))
    }
}

/// Where each tensor is: which file and which bytes.
pub struct ModelFiles {
    /// The model's hyper-parameters.
    pub config: LlamaConfig,
    /// The tokenizer, when the files have one.
    pub tokenizer: Option<Tokenizer>,
    /// Tensor names as in the files, with the index of their file.
    pub tensors: BTreeMap<String, (usize, RawTensor)>,
    /// The files' contents.
    pub files: Vec<FileBytes>,
    /// Names of the files, for errors.
    pub names: Vec<String>,
    /// `true` for GGUF (its weight names and its q/k row order).
    pub is_gguf: bool,
}

impl ModelFiles {
    /// Opens a Hugging Face model folder or a `.gguf` file.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &Path) -> Result<ModelFiles> {
        if path.is_dir() {
            open_folder(path)
        } else {
            let name = path.display().to_string();
            ModelFiles::from_gguf(&name, FileBytes::map(path)?)
        }
    }

    /// A GGUF file from its bytes.
    pub fn from_gguf(name: &str, bytes: FileBytes) -> Result<ModelFiles> {
        let g = gguf::parse(name, bytes.bytes())?;
        let config = config_from_gguf(&g, name)?;
        // A file without a vocabulary has no tokenizer; a broken vocabulary is an error.
        let tokenizer = g
            .metadata
            .contains_key("tokenizer.ggml.tokens")
            .then(|| Tokenizer::from_gguf(&g, name))
            .transpose()?;
        check_layer_count(&config, g.tensors.len(), &[name.to_string()])?;
        Ok(ModelFiles {
            config,
            tokenizer,
            tensors: g.tensors.into_iter().map(|(k, t)| (k, (0, t))).collect(),
            files: vec![bytes],
            names: vec![name.to_string()],
            is_gguf: true,
        })
    }

    /// A Hugging Face model from its files' contents: `config.json` text, the safetensors
    /// files (name, bytes), and optionally `tokenizer.json` text.
    pub fn from_parts(
        config_json: &str,
        shards: Vec<(String, FileBytes)>,
        tokenizer_json: Option<&str>,
    ) -> Result<ModelFiles> {
        let config = LlamaConfig::from_json(config_json, "config.json")?;
        let tokenizer = tokenizer_json
            .map(|t| Tokenizer::from_json(t, "tokenizer.json"))
            .transpose()?;
        let mut tensors = BTreeMap::new();
        let mut files = Vec::new();
        let mut names = Vec::new();
        for (i, (name, bytes)) in shards.into_iter().enumerate() {
            for (k, t) in safetensors::parse(&name, bytes.bytes())? {
                if let Some((first, _)) = tensors.insert(k.clone(), (i, t)) {
                    return Err(Error::model_file(
                        &name,
                        format!(
                            "the tensor `{k}` is also in {}; which one is meant is a guess",
                            names[first]
                        ),
                    ));
                }
            }
            files.push(bytes);
            names.push(name);
        }
        check_layer_count(&config, tensors.len(), &names)?;
        Ok(ModelFiles {
            config,
            tokenizer,
            tensors,
            files,
            names,
            is_gguf: false,
        })
    }

    /// The rotary pairing the q/k weights were stored for: GGUF's converter permutes their
    /// rows for interleaved pairs; Hugging Face weights use half-split pairs.
    pub fn rope_layout(&self) -> RopeLayout {
        if self.is_gguf {
            RopeLayout::Interleaved
        } else {
            RopeLayout::HalfSplit
        }
    }

    /// A tensor by name and the bytes of its file, or an error naming what is missing.
    pub fn get(&self, name: &str) -> Result<(&RawTensor, &[u8])> {
        let (file, t) = self.tensors.get(name).ok_or_else(|| {
            Error::model_file(
                self.names.join(", "),
                format!("the tensor `{name}` is missing"),
            )
        })?;
        Ok((t, self.files[*file].bytes()))
    }
}

/// Fails unless the files could hold the config's layers: each layer has at least nine
/// tensors, so a layer count beyond that is a lie that would only surface (or allocate)
/// later.
fn check_layer_count(config: &LlamaConfig, tensors: usize, names: &[String]) -> Result<()> {
    const TENSORS_PER_LAYER: usize = 9;
    if config.num_hidden_layers > tensors / TENSORS_PER_LAYER {
        return Err(Error::model_file(
            names.join(", "),
            format!(
                "the config has {} layers but the files hold only {tensors} tensors ({} per \
                 layer at least)",
                config.num_hidden_layers, TENSORS_PER_LAYER
            ),
        ));
    }
    Ok(())
}

/// The shard files a `model.safetensors.index.json` lists (`weight_map` values), sorted and
/// without repeats; `source` names the index in errors. Each must be a relative path of plain
/// names: an absolute path, or one with `..` or `.` parts, is refused, since a downloaded
/// index must not make the loader read files outside the model folder.
pub fn shard_names(index_json: &str, source: &str) -> Result<Vec<String>> {
    use std::path::{Component, Path};
    let bad = |reason: String| Error::model_file(source, reason);
    let v: serde_json::Value =
        serde_json::from_str(index_json).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut names = Vec::new();
    for (tensor, file) in map {
        let name = file.as_str().ok_or_else(|| {
            bad(format!(
                "`weight_map` gives {file} for `{tensor}`, not a file name"
            ))
        })?;
        let plain = Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        if name.is_empty() || !plain {
            return Err(bad(format!(
                "the shard path {name:?} is absolute or has `..` or `.` parts; shards must be \
                 files inside the model folder"
            )));
        }
        names.push(name.to_string());
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// The path of shard `name` (checked by [`shard_names`]) inside `dir`, refusing a symbolic
/// link that resolves outside the folder; `index` names the index in errors.
#[cfg(not(target_arch = "wasm32"))]
fn shard_path(dir: &Path, index: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io {
            path: p.display().to_string(),
            source,
        }
    };
    let real_dir = dir.canonicalize().map_err(io(dir))?;
    let real = path.canonicalize().map_err(io(&path))?;
    if !real.starts_with(&real_dir) {
        return Err(Error::model_file(
            index.display().to_string(),
            format!(
                "the shard path {name:?} leads out of the model folder through a symbolic link; \
                 shards must be files inside the model folder"
            ),
        ));
    }
    Ok(path)
}

#[cfg(not(target_arch = "wasm32"))]
fn open_folder(dir: &Path) -> Result<ModelFiles> {
    let read = |p: PathBuf| {
        std::fs::read_to_string(&p).map_err(|source| Error::Io {
            path: p.display().to_string(),
            source,
        })
    };
    let config = read(dir.join("config.json"))?;
    let tokenizer = dir
        .join("tokenizer.json")
        .exists()
        .then(|| read(dir.join("tokenizer.json")))
        .transpose()?;
    let index = dir.join("model.safetensors.index.json");
    let shard_names = if index.exists() {
        shard_names(&read(index.clone())?, &index.display().to_string())?
    } else {
        vec!["model.safetensors".into()]
    };
    let shards = shard_names
        .into_iter()
        .map(|n| {
            let path = shard_path(dir, &index, &n)?;
            Ok((path.display().to_string(), FileBytes::map(&path)?))
        })
        .collect::<Result<Vec<_>>>()?;
    ModelFiles::from_parts(&config, shards, tokenizer.as_deref())
}

/// The Llama config of a GGUF file's metadata (`{arch}.*` keys).
fn config_from_gguf(g: &Gguf, name: &str) -> Result<LlamaConfig> {
    let arch = g
        .metadata
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("llama")
        .to_string();
    let missing =
        |key: &str| Error::model_file(name, format!("metadata `{key}` is missing or not a number"));
    // A number that does not fit its field is an error, never truncated.
    let too_big = |key: &str, v: u64, max: u64| {
        Error::model_file(
            name,
            format!("metadata `{key}` = {v} is larger than {max}, the most it can be here"),
        )
    };
    let opt_int = |key: &str| -> Result<Option<usize>> {
        let full = format!("{arch}.{key}");
        match g.metadata.get(&full).and_then(GgufValue::as_u64) {
            None => Ok(None),
            Some(v) => usize::try_from(v)
                .map(Some)
                .map_err(|_| too_big(&full, v, usize::MAX as u64)),
        }
    };
    let int = |key: &str| -> Result<usize> {
        opt_int(key)?.ok_or_else(|| missing(&format!("{arch}.{key}")))
    };
    let float = |key: &str| {
        g.metadata
            .get(&format!("{arch}.{key}"))
            .and_then(GgufValue::as_f64)
    };
    let token_id = |key: &str| -> Result<Option<u32>> {
        let full = format!("tokenizer.ggml.{key}");
        match g.metadata.get(&full).and_then(GgufValue::as_u64) {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| too_big(&full, v, u32::MAX as u64)),
        }
    };
    let vocab_size = match opt_int("vocab_size")? {
        Some(v) => v,
        None => g
            .metadata
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map(gguf::GgufArray::len)
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?,
    };
    let heads = int("attention.head_count")?;
    let hidden = int("embedding_length")?;
    let config = LlamaConfig {
        vocab_size,
        hidden_size: hidden,
        intermediate_size: int("feed_forward_length")?,
        num_hidden_layers: int("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: opt_int("attention.head_count_kv")?,
        head_dim: opt_int("rope.dimension_count")?,
        max_position_embeddings: opt_int("context_length")?.unwrap_or(2048),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f32,
        hidden_act: "silu".into(),
        rope_theta: float("rope.freq_base").unwrap_or(10_000.0) as f32,
        attention_bias: g.tensors.contains_key("blk.0.attn_q.bias"),
        tie_word_embeddings: !g.tensors.contains_key("output.weight"),
        bos_token_id: token_id("bos_token_id")?,
        eos_token_id: token_id("eos_token_id")?,
    };
    config.validate(name)?;
    Ok(config)
}
