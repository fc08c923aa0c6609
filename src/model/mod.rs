//! Llama-family models: configuration, weight files (Hugging Face safetensors folders and
//! GGUF), and the pieces of the inference engine built on the op set.

pub mod builtin;
pub mod cache;
pub mod config;
pub mod files;
pub mod generate;
pub mod gguf;
pub mod linear;
pub mod llama;
pub mod safetensors;
pub mod sampler;
pub mod tokenizer;
pub mod weights;

pub use cache::{CacheLayout, KvCache, KvPool};
pub use config::LlamaConfig;
pub use files::{FileBytes, ModelFiles};
pub use generate::{generate, GenerationStats};
pub use linear::ActivationMode;
pub use llama::{Hook, Llama, SequenceInput, HOOK_NAMES};
pub use sampler::{Sampler, Sampling};
pub use tokenizer::{StreamDecoder, Tokenizer};
