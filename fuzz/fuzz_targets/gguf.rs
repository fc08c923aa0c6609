//! cargo-fuzz target `gguf`: see `fuzz/entries.rs`.
#![no_main]

#[path = "../entries.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::gguf(data));
