//! Opening model files: a Hugging Face folder (`config.json`, `model.safetensors` or shards
//! listed in `model.safetensors.index.json`, `tokenizer.json`) or a single GGUF file. Files
//! are memory-mapped on native targets, so weights go from the page cache to the device
//! without a second full copy in memory; on the host backends they stay in the map (their
//! storages borrow it, [`SharedBytes`]), and the file is held once.

use std::collections::BTreeMap;
use std::ops::Range;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chat::ChatTemplate;
use super::gguf;
use super::safetensors;
use super::weights::RawTensor;
use super::{LlamaConfig, Tokenizer};
use webtensor::backend::{RopeLayout, SharedBytes};
use webtensor::error::{Error, Result};

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

impl SharedBytes for FileBytes {
    fn bytes(&self) -> &[u8] {
        FileBytes::bytes(self)
    }

    /// Drops the map's resident pages wholly inside `range` (`MADV_DONTNEED`: the map is
    /// read-only, so a later read faults in the file's same bytes again); owned bytes stay.
    fn release(&self, range: Range<usize>) {
        #[cfg(unix)]
        if let FileBytes::Mapped(m) = self {
            let page = page_size();
            let base = m.as_ptr() as usize;
            let start = (base + range.start).next_multiple_of(page) - base;
            let end = ((base + range.end.min(m.len())) / page * page).saturating_sub(base);
            if start < end {
                // SAFETY: `DontNeed` on a shared read-only file map only drops pages that the
                // next access reads back from the file unchanged; nothing was written.
                let advice = memmap2::UncheckedAdvice::DontNeed;
                // A failed hint leaves the pages resident: nothing to report.
                let _ = unsafe { m.unchecked_advise_range(advice, start, end - start) };
            }
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

/// The size of a memory page.
#[cfg(unix)]
fn page_size() -> usize {
    // SAFETY: `sysconf` only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// Where each tensor is: which file and which bytes.
pub struct ModelFiles {
    /// The model's hyper-parameters.
    pub config: LlamaConfig,
    /// The tokenizer, when the files have one.
    pub tokenizer: Option<Tokenizer>,
    /// Tensor names as in the files, with the index of their file.
    pub tensors: BTreeMap<String, (usize, RawTensor)>,
    /// The files' contents, shared with the storages that borrow them.
    pub files: Vec<Arc<FileBytes>>,
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
        let config = LlamaConfig::from_gguf(&g, bytes.bytes(), name)?;
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
            files: vec![Arc::new(bytes)],
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
        let mut tokenizer = tokenizer_json
            .map(|t| Tokenizer::from_json(t, "tokenizer.json"))
            .transpose()?;
        if let Some(t) = &mut tokenizer {
            t.add_stop_ids(&eos_ids(config_json, "config.json")?);
        }
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
            files.push(Arc::new(bytes));
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

    /// A Hugging Face folder from its texts and its weight files (named as
    /// [`folder_shards`] lists them, with their bytes).
    pub fn from_folder(texts: FolderTexts, shards: Vec<(String, FileBytes)>) -> Result<ModelFiles> {
        let mut files = ModelFiles::from_parts(&texts.config, shards, texts.tokenizer.as_deref())?;
        files.add_tokenizer_config(
            texts.tokenizer_config.as_deref(),
            texts.chat_template.as_deref(),
        )?;
        if let Some(generation) = &texts.generation_config {
            files.add_generation_config(generation)?;
        }
        Ok(files)
    }

    /// Reads what `tokenizer_config.json` says about chat (its `chat_template`, and the
    /// `bos_token`/`eos_token` texts templates use), and `chat_template.jinja` (where newer
    /// transformers save the template; it wins over the one in `tokenizer_config.json`).
    pub fn add_tokenizer_config(
        &mut self,
        tokenizer_config_json: Option<&str>,
        chat_template_jinja: Option<&str>,
    ) -> Result<()> {
        let Some(tokenizer) = &mut self.tokenizer else {
            return Ok(());
        };
        let source = "tokenizer_config.json";
        let v: serde_json::Value = match tokenizer_config_json {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| Error::model_file(source, format!("not valid JSON: {e}")))?,
            None => serde_json::Value::Null,
        };
        // A string or an added-token object {"content": ...}.
        let token_text = |key: &str| {
            let t = &v[key];
            t.as_str()
                .or_else(|| t["content"].as_str())
                .map(str::to_string)
        };
        let in_config =
            |text: &str| ChatTemplate::new(text, "tokenizer_config.json (`chat_template`)");
        let template = match (&v["chat_template"], chat_template_jinja) {
            (_, Some(jinja)) => Some(ChatTemplate::new(jinja, "chat_template.jinja")),
            (serde_json::Value::String(s), None) => Some(in_config(s)),
            // A list of named templates: the default one.
            (serde_json::Value::Array(list), None) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(in_config),
            _ => None,
        };
        tokenizer.set_chat_template(
            template.or_else(|| tokenizer.chat_template().cloned()),
            token_text("bos_token"),
            token_text("eos_token"),
        );
        Ok(())
    }

    /// Adds the end-of-sequence ids of `generation_config.json` (Llama 3.1 lists several) to
    /// the tokens generation stops at.
    pub fn add_generation_config(&mut self, generation_config_json: &str) -> Result<()> {
        let ids = eos_ids(generation_config_json, "generation_config.json")?;
        if let Some(t) = &mut self.tokenizer {
            t.add_stop_ids(&ids);
        }
        Ok(())
    }

    /// The rotary pairing the q/k weights were stored for: llama.cpp's converter permutes
    /// the rows of GGUF `llama` (Mistral's included) and `smollm3` files for interleaved pairs
    /// ([`gguf_interleaved_rope`](super::arch::Architecture::gguf_interleaved_rope)); Hugging
    /// Face weights, and the other GGUF architectures (llama.cpp's NEOX rope), use half-split
    /// pairs.
    pub fn rope_layout(&self) -> RopeLayout {
        if self.is_gguf && self.config.architecture.gguf_interleaved_rope() {
            RopeLayout::Interleaved
        } else {
            RopeLayout::HalfSplit
        }
    }

    /// A tensor by name and the bytes of its file, or an error naming what is missing.
    pub fn get(&self, name: &str) -> Result<(&RawTensor, &Arc<FileBytes>)> {
        let (file, t) = self.tensors.get(name).ok_or_else(|| {
            Error::model_file(
                self.names.join(", "),
                format!("the tensor `{name}` is missing"),
            )
        })?;
        Ok((t, &self.files[*file]))
    }
}

/// The `eos_token_id` of a JSON config: a number or a list of them.
fn eos_ids(json: &str, source: &str) -> Result<Vec<u32>> {
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| Error::model_file(source, format!("not valid JSON: {e}")))?;
    let id = |x: &serde_json::Value| {
        x.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| Error::model_file(source, format!("eos_token_id {x} is not a token id")))
    };
    match &v["eos_token_id"] {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Array(list) => list.iter().map(id).collect(),
        one => Ok(vec![id(one)?]),
    }
}

/// Fails unless the files could hold the config's layers: each layer has at least
/// [`min_tensors_per_layer`](super::arch::Architecture::min_tensors_per_layer) tensors, so a
/// layer count beyond that is a lie that would only surface (or allocate) later.
fn check_layer_count(config: &LlamaConfig, tensors: usize, names: &[String]) -> Result<()> {
    let per_layer = config.architecture.min_tensors_per_layer();
    if config.num_hidden_layers > tensors / per_layer {
        return Err(Error::model_file(
            names.join(", "),
            format!(
                "the config has {} layers but the files hold only {tensors} tensors ({} per \
                 layer at least)",
                config.num_hidden_layers, per_layer
            ),
        ));
    }
    Ok(())
}

/// The index of a sharded Hugging Face folder.
pub const INDEX: &str = "model.safetensors.index.json";

/// The weights of an unsharded Hugging Face folder.
const SINGLE_SHARD: &str = "model.safetensors";

/// The texts a Hugging Face folder holds beside its weights, read by whoever has the folder
/// (the file system natively, the files a page was given in the browser) and turned into a
/// model by [`ModelFiles::from_folder`], so both read the same files the same way.
pub struct FolderTexts {
    config: String,
    tokenizer: Option<String>,
    tokenizer_config: Option<String>,
    chat_template: Option<String>,
    generation_config: Option<String>,
}

impl FolderTexts {
    /// The files read, in the order [`FolderTexts::from_texts`] takes them: `config.json`
    /// (required), `tokenizer.json`, `tokenizer_config.json` (the chat template and the BOS
    /// and EOS texts), `chat_template.jinja` (where newer transformers save the template) and
    /// `generation_config.json` (more end-of-sequence ids).
    pub const NAMES: [&'static str; 5] = [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ];

    /// The texts of [`FolderTexts::NAMES`], `None` for a file the folder lacks; `folder`
    /// names it in the error when it has no `config.json`.
    pub fn from_texts(texts: Vec<Option<String>>, folder: &str) -> Result<FolderTexts> {
        let mut texts = texts.into_iter();
        let mut next = || texts.next().flatten();
        let config = next().ok_or_else(|| {
            Error::model_file(
                folder,
                "no config.json: a Hugging Face model folder has config.json and its \
                 *.safetensors weights (or give a .gguf file)",
            )
        })?;
        Ok(FolderTexts {
            config,
            tokenizer: next(),
            tokenizer_config: next(),
            chat_template: next(),
            generation_config: next(),
        })
    }
}

/// The weight files of a Hugging Face folder, in load order: the shards its
/// [`INDEX`] lists (`index_json`, checked by [`shard_names`]) where it has one, else its one
/// `model.safetensors` (`has` says which files the folder holds). `folder` names it in errors.
pub fn folder_shards(
    has: impl Fn(&str) -> bool,
    index_json: Option<&str>,
    folder: &str,
) -> Result<Vec<String>> {
    match index_json {
        Some(index) => shard_names(index, &format!("{folder}/{INDEX}")),
        None if has(SINGLE_SHARD) => Ok(vec![SINGLE_SHARD.to_string()]),
        None => Err(Error::model_file(
            folder,
            format!("no {SINGLE_SHARD} and no {INDEX} listing shards: the folder has no weights"),
        )),
    }
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
    let optional = |name: &str| {
        let path = dir.join(name);
        path.exists().then(|| read(path)).transpose()
    };
    let texts = FolderTexts::NAMES
        .iter()
        .map(|name| optional(name))
        .collect::<Result<Vec<_>>>()?;
    let texts = FolderTexts::from_texts(texts, &dir.display().to_string())?;
    let index = dir.join(INDEX);
    let names = folder_shards(
        |name| dir.join(name).is_file(),
        optional(INDEX)?.as_deref(),
        &dir.display().to_string(),
    )?;
    let shards = names
        .into_iter()
        .map(|n| {
            let path = shard_path(dir, &index, &n)?;
            Ok((path.display().to_string(), FileBytes::map(&path)?))
        })
        .collect::<Result<Vec<_>>>()?;
    ModelFiles::from_folder(texts, shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folders_weights_are_its_index_shards_or_its_one_file() {
        let index = r#"{"weight_map": {"b": "model-2.safetensors", "a": "model-1.safetensors",
            "c": "model-2.safetensors"}}"#;
        let all = |_: &str| true;
        assert_eq!(
            folder_shards(all, Some(index), "f").unwrap(),
            ["model-1.safetensors", "model-2.safetensors"]
        );
        assert_eq!(
            folder_shards(|n| n == "model.safetensors", None, "f").unwrap(),
            ["model.safetensors"]
        );
        let e = folder_shards(|_| false, None, "dir")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dir") && e.contains("no model.safetensors"),
            "{e}"
        );
        let escape = r#"{"weight_map": {"a": "../model.safetensors"}}"#;
        assert!(folder_shards(all, Some(escape), "f").is_err());
    }

    #[test]
    fn a_folder_without_config_json_is_an_error_that_names_it() {
        let texts = vec![None, Some("{}".to_string()), None, None, None];
        let e = FolderTexts::from_texts(texts, "picked")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("picked") && e.contains("no config.json"), "{e}");
    }

    /// Resident bytes of this process's map that starts at `addr` (`Rss` in smaps).
    #[cfg(target_os = "linux")]
    fn mapped_rss(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        let start = format!("{addr:x}-");
        lines
            .by_ref()
            .find(|l| l.starts_with(&start))
            .expect("the map is listed");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        let kb: usize = rss.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    }

    /// A `Q4_0` weight borrowed from a mapped file: the cpu backend's product equals the
    /// reference's; where it repacks, the weight's pages leave the process's memory (the
    /// copy replaces them), and the weight still downloads and dequantizes as the file's
    /// bytes.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_weight_leaves_memory_once_repacked_and_reads_back_unchanged() {
        use super::super::weights::StoredDType;
        use webtensor::backend::{cpu::CpuBackend, Activations};
        use webtensor::dtype::DType;
        use webtensor::{ops, Device, Tensor};

        let (n, k) = (96, 2048);
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 7) as f32))
            .collect();
        let mut w = vec![0u8; n * DType::Q4_0.row_bytes(k)];
        webtensor::quant::quantize(DType::Q4_0, &values, &mut w);
        let path = std::env::temp_dir().join(format!("webtensor-map-{}.bin", std::process::id()));
        std::fs::write(&path, &w).unwrap();
        let file = Arc::new(FileBytes::map(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let raw = RawTensor {
            dtype: StoredDType::Packed(DType::Q4_0),
            shape: vec![n, k],
            range: 0..w.len(),
        };
        let base = file.bytes().as_ptr() as usize;
        assert_eq!(file.bytes(), &w[..]);
        assert!(
            mapped_rss(base) >= w.len() / 4096 * 4096,
            "read, so resident"
        );

        let acts: Vec<f32> = (0..3 * k).map(|i| (i % 11) as f32 / 5.0 - 1.0).collect();
        let product = |device: &Device| {
            let weight = raw.to_device(device, &file).unwrap();
            let a = Tensor::from_vec(device, acts.clone(), [3, k]).unwrap();
            let out = ops::qmatmul_t(&a, &weight, Activations::Q8_0).unwrap();
            (weight, out.to_vec::<f32>().unwrap())
        };
        let (_, want) = product(&Device::reference());
        let (weight, got) = product(&Device::cpu());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "{g} vs {w}");
        }
        if CpuBackend::new().repacks_weights() {
            assert!(
                mapped_rss(base) < 2 * 4096,
                "released: {}",
                mapped_rss(base)
            );
        }
        assert_eq!(weight.to_bytes().unwrap(), w);
        let mut plain = vec![0f32; n * k];
        webtensor::quant::dequantize(DType::Q4_0, &w, &mut plain);
        let dequantized = ops::dequantize(&weight).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(dequantized, plain);
    }
}
