//! A sequence's keys and values kept from one generation to the next, with the ids they were
//! computed for, so that a prompt beginning as the last one did runs only what follows the
//! shared part.
//!
//! A conversation's next turn is the previous prompt, the reply, and a new message: with the
//! cache kept, turn ten runs its new message, not ten turns. The shared part is found on the
//! ids (not the text), so whatever the chat template writes around a reply, the cache is cut
//! back exactly to where the new prompt departs from what it holds.

use super::{KvCache, Llama};
use webtensor::error::Result;

/// The fewest tokens a cache with room to grow holds (within the model's context): a chat's
/// first turns are short, and a cache sized to twice one of them would be outgrown at once.
const MIN_ROOM_TO_GROW: usize = 1024;

/// The cache of the last generation and the ids it holds, for the next one
/// ([`super::generate::run_async`]). Empty at first; a generation that fails leaves it empty.
#[derive(Default)]
pub struct PromptCache {
    /// The cache, `None` before the first generation or while one runs.
    cache: Option<KvCache>,
    /// The ids whose keys and values `cache` holds, in order (as many as its length).
    held: Vec<u32>,
    /// Whether a new cache is made twice as large as its generation needs, so that the
    /// generations after it (a conversation's next turns) fit it too.
    room_to_grow: bool,
}

impl PromptCache {
    /// An empty prompt cache for a conversation, or any run of generations that may share
    /// their prompts' starts: the first runs its whole prompt. Each cache it makes has room
    /// for twice what its generation needs, and at least [`MIN_ROOM_TO_GROW`] tokens (within
    /// the model's context), so a growing conversation runs all of itself again only when it
    /// has doubled.
    pub fn new() -> PromptCache {
        PromptCache {
            room_to_grow: true,
            ..PromptCache::default()
        }
    }

    /// An empty prompt cache for one generation: its cache has room for that generation
    /// alone (a long-context model's full cache can take gigabytes).
    pub fn for_one_prompt() -> PromptCache {
        PromptCache::default()
    }

    /// The ids whose keys and values are kept.
    pub fn held(&self) -> &[u32] {
        &self.held
    }

    /// Forgets what is kept (and frees its memory): the next generation runs its whole prompt.
    pub fn clear(&mut self) {
        self.cache = None;
        self.held.clear();
    }

    /// Takes the cache out for a generation of `prompt` (not empty) and up to `max_tokens`
    /// more ids: cut back to the longest start of `prompt` it holds, short of its last id
    /// (whose logits draw the first new token). When it has too little room for the rest, a
    /// new one replaces it, sized for this generation within the model's context (twice that
    /// with room to grow). Answers the cache and how many ids of `prompt` it holds; hand it
    /// back with [`PromptCache::keep`].
    pub(crate) fn take(
        &mut self,
        model: &Llama,
        prompt: &[u32],
        max_tokens: usize,
    ) -> Result<(KvCache, usize)> {
        let context = model.config.context_len();
        // Saturating: `max_tokens` may be anything a user typed, up to 2^64 − 1.
        let wanted = context.min(prompt.len().saturating_add(max_tokens.max(1)));
        let shared = shared_prefix(&self.held, prompt).min(prompt.len().saturating_sub(1));
        self.held.clear();
        match self.cache.take() {
            Some(mut cache) if cache.capacity() >= wanted => {
                cache.truncate(shared)?;
                Ok((cache, shared))
            }
            old => {
                // The old cache is freed before the new one is made.
                drop(old);
                let capacity = match self.room_to_grow {
                    true => context.min(wanted.saturating_mul(2).max(MIN_ROOM_TO_GROW)),
                    false => wanted,
                };
                Ok((model.new_cache(capacity)?, 0))
            }
        }
    }

    /// Keeps `cache` after a generation: it holds `prompt`, then the drawn ids that were fed
    /// back (each but the last of `drawn`, whose step did not run before the generation
    /// ended). Keys past those, written by steps recorded ahead, are cut off.
    pub(crate) fn keep(
        &mut self,
        mut cache: KvCache,
        prompt: Vec<u32>,
        drawn: &[u32],
    ) -> Result<()> {
        let mut held = prompt;
        held.extend_from_slice(&drawn[..drawn.len().saturating_sub(1)]);
        if cache.len() < held.len() {
            // Stopped before the prompt had run: keep only what did.
            held.truncate(cache.len());
        }
        cache.truncate(held.len())?;
        self.cache = Some(cache);
        self.held = held;
        Ok(())
    }
}

/// How many leading ids `a` and `b` share.
fn shared_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin;
    use webtensor::device::Device;

    #[test]
    fn the_shared_prefix_stops_at_the_first_difference() {
        assert_eq!(shared_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(shared_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(shared_prefix(&[], &[1]), 0);
        assert_eq!(shared_prefix(&[7], &[1]), 0);
    }

    #[test]
    fn a_prompt_that_continues_the_held_ids_reuses_them_and_leaves_its_last_to_run() {
        let model = Llama::load(&Device::cpu(), builtin::files().unwrap()).unwrap();
        let mut pc = PromptCache::new();
        let (cache, reused) = pc.take(&model, &[1, 5, 6, 7], 1).unwrap();
        assert_eq!(reused, 0);
        assert!(cache.is_empty());
        // As if the prompt ran and two ids were drawn (the last one not fed back).
        let mut cache = cache;
        let mut sampler = crate::Sampler::new(crate::Sampling::greedy());
        let first = model
            .sample_next(&[1, 5, 6, 7], &mut cache, &mut sampler)
            .unwrap();
        model.decode(first, &mut cache, 1, &mut sampler).unwrap();
        assert_eq!(cache.len(), 5);
        pc.keep(cache, vec![1, 5, 6, 7], &[first, 9]).unwrap();
        assert_eq!(pc.held(), &[1, 5, 6, 7, first]);

        // The next prompt departs after three ids: three are reused.
        let (cache, reused) = pc.take(&model, &[1, 5, 6, 8, 8], 2).unwrap();
        assert_eq!((reused, cache.len()), (3, 3));
        pc.keep(cache, vec![1, 5, 6], &[]).unwrap();
        // The same prompt again: all but its last id.
        let (cache, reused) = pc.take(&model, &[1, 5, 6], 2).unwrap();
        assert_eq!((reused, cache.len()), (2, 2));
        assert_eq!(cache.capacity(), 256, "the built-in model's context");
        // A cache for one prompt has room for it alone, and is replaced when a prompt needs
        // more: nothing reused.
        let mut one = PromptCache::for_one_prompt();
        let (cache, _) = one.take(&model, &[1, 5, 6], 2).unwrap();
        assert_eq!(cache.capacity(), 5);
        one.keep(cache, vec![1, 5, 6], &[]).unwrap();
        let (cache, reused) = one.take(&model, &[1, 5, 6, 7, 8], 2).unwrap();
        assert_eq!((reused, cache.capacity()), (0, 7));
    }
}
