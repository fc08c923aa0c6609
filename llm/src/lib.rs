//! # webtensor-llm
//!
//! Llama-family models on any [`webtensor`] device: configuration, weight files (Hugging Face
//! safetensors folders and GGUF), tokenizers, chat templates, paged KV caches, sampling and the
//! generation loop, all built on the library's op set. Its own crate, so that a program that
//! only runs ops does not compile the tokenizers' and templates' dependencies.

pub mod arch;
pub mod builtin;
pub mod cache;
pub mod chat;
pub mod config;
mod config_gguf;
pub mod files;
pub mod generate;
pub mod gguf;
pub mod linear;
pub mod llama;
mod loader;
mod prompt_cache;
pub mod rope;
pub mod safetensors;
pub mod sampler;
pub mod tensor_parallel;
pub mod tokenizer;
pub mod weights;

pub use arch::Architecture;
pub use cache::{CacheLayout, KvCache, KvPool};
pub use chat::{
    ChatMessage, ChatOptions, ChatTemplate, RenderLimits, RenderRequest, TemplateRenderer,
};
pub use config::LlamaConfig;
pub use files::{FileBytes, ModelFiles};
pub use generate::GenerationStats;
#[cfg(not(target_arch = "wasm32"))]
pub use generate::{generate, generate_chat};
pub use linear::ActivationMode;
pub use llama::{Hook, HookPoint, Llama, SequenceInput};
pub use prompt_cache::PromptCache;
pub use rope::{Rope, RopeScaling};
pub use sampler::{Sampler, Sampling};
pub use tensor_parallel::{Collective, CollectiveStats, HostCollective, TpConfig};
pub use tokenizer::{StreamDecoder, Tokenizer};

// Whole-model timing: native only, as `bench --model` is.
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;

/// The chat example of docs/models.md runs as a doc test, so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../docs/models.md")]
pub struct ModelsDoctests;
