//! The model cache folder: `webtensor models` lists it, and `--model NAME` finds models in it.
//!
//! The folder is `$WEBTENSOR_MODELS`, else `$XDG_CACHE_HOME/webtensor/models`, else
//! `~/.cache/webtensor/models`. A model there is a `.gguf` file or a Hugging Face folder
//! (one with a `config.json`); put (or link) models there to call them by name:
//! `--model SmolLM2-135M-Instruct-Q8_0` finds `SmolLM2-135M-Instruct-Q8_0.gguf`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use webtensor::Error;

/// The cache folder (which need not exist).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WEBTENSOR_MODELS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("webtensor").join("models")
}

/// What `--model` names: `Ok(None)` for the built-in model (`builtin`), the path itself when
/// it exists, else the cache folder's `NAME`, `NAME.gguf`; an error naming both places when
/// none exists.
pub fn resolve(name: &Path) -> Result<Option<PathBuf>, Error> {
    if name.as_os_str() == "builtin" {
        return Ok(None);
    }
    if name.exists() {
        return Ok(Some(name.to_path_buf()));
    }
    let dir = cache_dir();
    // Only a bare name is looked up in the cache: a path that does not exist is an error.
    if name.components().count() == 1 {
        let plain = dir.join(name);
        let gguf = dir.join(format!("{}.gguf", name.display()));
        if let Some(found) = [plain, gguf].into_iter().find(|p| p.exists()) {
            return Ok(Some(found));
        }
    }
    Err(Error::InvalidArgument {
        op: "--model",
        reason: format!(
            "`{}` is neither a file or folder nor a model in the cache folder {} \
             (`webtensor models` lists them; `builtin` is the built-in tiny model)",
            name.display(),
            dir.display()
        ),
    })
}

/// The name a model is shown under (`/v1/models`): its file or folder name without `.gguf`.
pub fn display_name(path: &Path) -> String {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

/// One cached model.
#[derive(Serialize)]
struct Entry {
    /// What `--model` takes.
    name: String,
    /// `gguf` or `hf` (a Hugging Face folder).
    format: &'static str,
    /// Bytes on disk (a folder: its files, not following links out of it).
    bytes: u64,
    path: PathBuf,
}

#[derive(Serialize)]
struct Listing {
    dir: PathBuf,
    models: Vec<Entry>,
}

/// `webtensor models`: the cached models and their sizes, by name.
pub fn list(json: bool) -> Result<(), Error> {
    let dir = cache_dir();
    let models = entries(&dir)?;
    if json {
        let listing = Listing { dir, models };
        println!(
            "{}",
            serde_json::to_string_pretty(&listing).expect("the listing serialises")
        );
        return Ok(());
    }
    println!("models in {}", dir.display());
    if models.is_empty() {
        println!(
            "  (none: put .gguf files or Hugging Face folders there, or set WEBTENSOR_MODELS)"
        );
    }
    for m in &models {
        println!(
            "  {:<40} {:<5} {}",
            m.name,
            m.format,
            super::info::bytes(m.bytes)
        );
    }
    Ok(())
}

/// The models in `dir`, sorted by name; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<Entry>, Error> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Io {
                path: dir.display().to_string(),
                source,
            })
        }
    };
    let mut models: Vec<Entry> = read
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let path = e.path();
            let file_name = e.file_name().to_string_lossy().to_string();
            if path.is_dir() && path.join("config.json").is_file() {
                Some(Entry {
                    name: file_name,
                    format: "hf",
                    bytes: folder_bytes(&path),
                    path,
                })
            } else if path.is_file() && file_name.ends_with(".gguf") {
                Some(Entry {
                    name: display_name(&path),
                    format: "gguf",
                    bytes: std::fs::metadata(&path).map_or(0, |m| m.len()),
                    path,
                })
            } else {
                None
            }
        })
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

/// Bytes of the regular files in `dir` (its files may be links into a download cache: they
/// are followed, folders inside are not).
fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |read| {
        read.filter_map(|e| e.ok())
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    })
}
