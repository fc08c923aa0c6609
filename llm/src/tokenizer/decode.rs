//! Streaming decode: ids in, text out as soon as it is whole.

use super::Tokenizer;

/// Turns ids into text incrementally: bytes of a character split across tokens are held back
/// until the character is complete. It continues a text, so a leading space is kept.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(super) fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one id; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend(self.tokenizer.bytes_of(id, false));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An incomplete character at the end waits; a broken one in the middle is replaced.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let ready: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&ready).into_owned()
    }

    /// Whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}
