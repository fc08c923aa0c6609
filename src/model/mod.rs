//! Llama-family models: configuration, weight files (Hugging Face safetensors folders and
//! GGUF), and the pieces of the inference engine built on the op set.

pub mod config;
pub mod gguf;
pub mod safetensors;
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use tokenizer::{StreamDecoder, Tokenizer};
