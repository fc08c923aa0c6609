//! Who holds each block of a paged [`super::KvPool`], and which full blocks are kept for the
//! prompts that begin with the same ids.
//!
//! A block is *held* by the sequences whose tables list it (a reference count). A full block
//! whose ids a sequence offered ([`Blocks::publish`]) is also *indexed*: found by its ids and
//! the block before it, so a later sequence whose prompt begins the same way holds it too
//! ([`Blocks::lookup`]) instead of computing it again. An indexed block no sequence holds
//! stays cached until the pool needs room: [`Blocks::take`] evicts the one used longest ago
//! only when no block is free, so sharing never refuses a sequence that would fit without it.
//!
//! The index key is the block's ids and the id of the indexed block before it (the whole
//! prefix, by induction), compared exactly: no hash stands in for the ids.

use std::collections::HashMap;

/// A block's place in the index: the indexed block before it (`None` for a first block) and
/// its ids.
type Key = (Option<usize>, Box<[u32]>);

/// An indexed block.
struct Entry {
    key: Key,
    /// Indexed blocks whose key names this one: forgotten with it.
    children: Vec<usize>,
    /// When it was last found or offered ([`Blocks::clock`]).
    used: u64,
}

pub(super) struct Blocks {
    /// Sequences holding each block.
    refs: Vec<u32>,
    /// Blocks neither held nor indexed; taken from the end.
    free: Vec<usize>,
    index: HashMap<Key, usize>,
    /// Per block, its index entry when indexed.
    entries: Vec<Option<Entry>>,
    /// Counts lookups and offers, to order the cached blocks by use.
    clock: u64,
}

impl Blocks {
    pub(super) fn new(blocks: usize) -> Blocks {
        Blocks {
            refs: vec![0; blocks],
            free: (0..blocks).rev().collect(),
            index: HashMap::new(),
            entries: (0..blocks).map(|_| None).collect(),
            clock: 0,
        }
    }

    /// Blocks a sequence can take: free ones and cached ones no sequence holds.
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.idle().count()
    }

    /// Indexed blocks no sequence holds.
    fn idle(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.refs.len()).filter(|&b| self.refs[b] == 0 && self.entries[b].is_some())
    }

    /// A block for one sequence alone: a free one, or else the cached block used longest ago
    /// (a leaf first among equals), evicted. `None` when every block is held.
    pub(super) fn take(&mut self) -> Option<usize> {
        if self.free.is_empty() {
            let victim = self.idle().min_by_key(|&b| {
                let e = self.entries[b].as_ref();
                (
                    e.map_or(0, |e| e.used),
                    e.is_some_and(|e| !e.children.is_empty()),
                )
            })?;
            self.forget(victim);
        }
        let b = self.free.pop()?;
        self.refs[b] = 1;
        Some(b)
    }

    /// One more sequence holds `b` (found by [`Blocks::lookup`]).
    pub(super) fn hold(&mut self, b: usize) {
        self.refs[b] += 1;
    }

    /// One sequence fewer holds `b`; a block no one holds is free unless it is indexed.
    pub(super) fn release(&mut self, b: usize) {
        self.refs[b] = self.refs[b].saturating_sub(1);
        if self.refs[b] == 0 && self.entries[b].is_none() {
            self.free.push(b);
        }
    }

    /// Whether writing into `b` would change what another sequence or the index reads.
    pub(super) fn shared(&self, b: usize) -> bool {
        self.refs[b] > 1 || self.entries[b].is_some()
    }

    /// Whether another sequence holds `b` too.
    pub(super) fn held_by_others(&self, b: usize) -> bool {
        self.refs[b] > 1
    }

    /// The indexed blocks that hold `ids` from its start, block by block, at most
    /// `max_blocks` of them (not yet held: see [`Blocks::hold`]).
    pub(super) fn lookup(
        &mut self,
        ids: &[u32],
        block_size: usize,
        max_blocks: usize,
    ) -> Vec<usize> {
        self.clock += 1;
        let mut found = Vec::new();
        let mut parent = None;
        for chunk in ids.chunks_exact(block_size).take(max_blocks) {
            let key: Key = (parent, chunk.into());
            let Some(&b) = self.index.get(&key) else {
                break;
            };
            self.touch(b);
            found.push(b);
            parent = Some(b);
        }
        found
    }

    /// Indexes the full blocks of `table` (a sequence's) as holding `ids` from its start,
    /// where an equal block is not indexed already.
    pub(super) fn publish(&mut self, table: &[usize], ids: &[u32], block_size: usize) {
        self.clock += 1;
        let mut parent = None;
        for (&b, chunk) in table.iter().zip(ids.chunks_exact(block_size)) {
            let key: Key = (parent, chunk.into());
            let indexed = match self.index.get(&key) {
                Some(&other) => other,
                // A block is indexed under one key only.
                None if self.entries[b].is_some() => return,
                None => {
                    if let Some(p) = parent.and_then(|p| self.entries[p].as_mut()) {
                        p.children.push(b);
                    }
                    self.index.insert(key.clone(), b);
                    self.entries[b] = Some(Entry {
                        key,
                        children: Vec::new(),
                        used: 0,
                    });
                    b
                }
            };
            self.touch(indexed);
            parent = Some(indexed);
        }
    }

    fn touch(&mut self, b: usize) {
        if let Some(e) = self.entries[b].as_mut() {
            e.used = self.clock;
        }
    }

    /// Takes `b` and the blocks indexed after it out of the index (their keys name it); those
    /// no sequence holds become free.
    pub(super) fn forget(&mut self, b: usize) {
        if let Some((parent, _)) = self.entries[b].as_ref().map(|e| &e.key) {
            if let Some(p) = parent.and_then(|p| self.entries[p].as_mut()) {
                p.children.retain(|&c| c != b);
            }
        }
        let mut stack = vec![b];
        while let Some(b) = stack.pop() {
            let Some(entry) = self.entries[b].take() else {
                continue;
            };
            self.index.remove(&entry.key);
            stack.extend(entry.children);
            if self.refs[b] == 0 {
                self.free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_or_cached_block_is_not_handed_out_until_evicted() {
        let mut blocks = Blocks::new(3);
        let a = blocks.take().unwrap();
        let b = blocks.take().unwrap();
        blocks.publish(&[a, b], &[1, 2, 3, 4], 2);
        // Another prompt beginning [1, 2] finds a, not b.
        assert_eq!(blocks.lookup(&[1, 2, 9, 9], 2, 2), [a]);
        assert_eq!(blocks.lookup(&[1, 2, 3, 4], 2, 1), [a]);
        assert_eq!(blocks.lookup(&[3, 4], 2, 1), Vec::<usize>::new());
        blocks.release(a);
        blocks.release(b);
        // Both cached, idle: available but not free.
        assert_eq!(blocks.available(), 3);
        let c = blocks.take().unwrap();
        assert!(![a, b].contains(&c));
        // No block is free: the next take evicts one used longest ago, the leaf b before a
        // (both were found last by the same lookup).
        blocks.lookup(&[1, 2, 3, 4], 2, 2);
        assert_eq!(blocks.take(), Some(b));
        assert_eq!(blocks.lookup(&[1, 2, 3, 4], 2, 2), [a]);
        // Then a.
        assert_eq!(blocks.take(), Some(a));
        assert!(blocks.lookup(&[1, 2, 3, 4], 2, 2).is_empty());
        assert!(blocks.take().is_none(), "all three held");
    }

    #[test]
    fn a_block_held_by_two_is_free_only_after_both_release_it() {
        let mut blocks = Blocks::new(1);
        let a = blocks.take().unwrap();
        blocks.hold(a);
        assert!(blocks.held_by_others(a));
        blocks.release(a);
        assert!(blocks.take().is_none());
        blocks.release(a);
        assert_eq!(blocks.take(), Some(a));
    }
}
