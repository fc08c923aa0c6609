//! The built-in default model: `assets/tiny-kjv`, a ~0.8M-parameter Llama trained by
//! `scripts/train_tiny_model.py` on the King James Bible (public domain), compiled into the
//! library (1.6 MB of f16 weights) so `webtensor generate` works with no download.

use super::files::{FileBytes, ModelFiles};
use webtensor::error::Result;

const CONFIG: &str = include_str!("../../assets/tiny-kjv/config.json");
const TOKENIZER: &str = include_str!("../../assets/tiny-kjv/tokenizer.json");
const WEIGHTS: &[u8] = include_bytes!("../../assets/tiny-kjv/model.safetensors");

/// The name the built-in model goes by in messages and reports.
pub const NAME: &str = "built-in tiny-kjv";

/// The built-in model's files.
pub fn files() -> Result<ModelFiles> {
    ModelFiles::from_parts(
        CONFIG,
        vec![(
            format!("{NAME}/model.safetensors"),
            FileBytes::Owned(WEIGHTS.to_vec()),
        )],
        Some(TOKENIZER),
    )
}
