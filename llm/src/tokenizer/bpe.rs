//! Byte-pair merging of one piece in O(n log n): a priority queue over adjacent pairs, each
//! entry checked when it comes out (a merge nearby may have made it stale), as Hugging Face
//! `tokenizers` and llama.cpp both do it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use webtensor::error::{Error, Result};

/// How adjacent pieces merge.
#[derive(Clone, Debug)]
pub enum Merges {
    /// By rank in a merge list (lower first): `(left, right) → (rank, merged)`.
    Ranked(HashMap<(u32, u32), (u32, u32)>),
    /// By the score of the merged piece (higher first), as SentencePiece vocabularies give
    /// them; the merged piece is looked up by its text.
    Scored(Vec<f32>),
}

/// Each piece's id by its text (the first id where a text repeats), for [`Merges::ranked`].
pub fn piece_ids(pieces: &[String]) -> HashMap<&str, u32> {
    pieces
        .iter()
        .enumerate()
        .rev()
        .map(|(i, p)| (p.as_str(), i as u32))
        .collect()
}

/// An order-preserving u32 for an f32 (NaN aside).
fn sortable(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

impl Merges {
    /// The merges of a merge list (`tokenizer.json`'s `merges`, GGUF's `tokenizer.ggml.merges`),
    /// ranked by position: each `(a, b)` pair becomes `(id a, id b) → (rank, id ab)`; `ids`
    /// finds a piece's id by its text.
    ///
    /// A merge naming a piece that is not in the vocabulary (`a`, `b` or `ab`) is an error that
    /// names it, as Hugging Face `tokenizers` makes it (llama.cpp would merge such a pair and
    /// then spell the unknown result in bytes, so skipping it would also differ from llama.cpp).
    /// A pair listed twice is an error too: `tokenizers` keeps the last rank and llama.cpp the
    /// first, so either choice would silently disagree with one of them.
    pub fn ranked<'a>(
        merges: impl IntoIterator<Item = Result<(&'a str, &'a str)>>,
        ids: &HashMap<&str, u32>,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Merges> {
        let mut ranks = HashMap::new();
        for (rank, merge) in merges.into_iter().enumerate() {
            let (a, b) = merge?;
            let merged = format!("{a}{b}");
            let id = |piece: &str| {
                ids.get(piece).copied().ok_or_else(|| {
                    bad(format!(
                        "merge {rank} \"{a} {b}\" names the piece {piece:?}, which is not in the \
                         vocabulary"
                    ))
                })
            };
            let (x, y, z) = (id(a)?, id(b)?, id(&merged)?);
            let rank = u32::try_from(rank).map_err(|_| bad("over 2^32 merges".into()))?;
            if let Some((first, _)) = ranks.insert((x, y), (rank, z)) {
                return Err(bad(format!(
                    "merge {rank} \"{a} {b}\" repeats merge {first}; a pair may be listed once"
                )));
            }
        }
        Ok(Merges::Ranked(ranks))
    }

    /// The priority (lower merges first) and result of merging `a` with `b`; `lookup` finds a
    /// piece's id by its text, `pieces` gives the text of an id.
    fn rule(
        &self,
        a: u32,
        b: u32,
        pieces: &[String],
        lookup: &HashMap<String, u32>,
    ) -> Option<(u32, u32)> {
        match self {
            Merges::Ranked(ranks) => ranks.get(&(a, b)).copied(),
            Merges::Scored(scores) => {
                let (pa, pb) = (pieces.get(a as usize)?, pieces.get(b as usize)?);
                let mut s = String::with_capacity(pa.len() + pb.len());
                s.push_str(pa);
                s.push_str(pb);
                let id = *lookup.get(&s)?;
                let score = *scores.get(id as usize)?;
                Some((u32::MAX - sortable(score), id))
            }
        }
    }

    /// Merges `symbols` (ids, in order) until no adjacent pair merges. Ties go to the leftmost
    /// pair.
    pub fn apply(
        &self,
        symbols: &[u32],
        pieces: &[String],
        lookup: &HashMap<String, u32>,
    ) -> Vec<u32> {
        const NONE: usize = usize::MAX;
        let n = symbols.len();
        let mut ids = symbols.to_vec();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)).collect();
        let mut alive = vec![true; n];
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, ids: &[u32], left: usize, right: usize| {
            if left != NONE && right != NONE {
                if let Some((priority, merged)) = self.rule(ids[left], ids[right], pieces, lookup) {
                    queue.push(Reverse((priority, left, merged)));
                }
            }
        };
        for i in 1..n {
            push(&mut queue, &ids, i - 1, i);
        }
        while let Some(Reverse((priority, left, merged))) = queue.pop() {
            let right = next[left];
            if !alive[left] || right == NONE {
                continue;
            }
            // Stale when either side has changed since the pair was queued.
            if self.rule(ids[left], ids[right], pieces, lookup) != Some((priority, merged)) {
                continue;
            }
            ids[left] = merged;
            alive[right] = false;
            next[left] = next[right];
            if next[right] != NONE {
                prev[next[right]] = left;
            }
            push(&mut queue, &ids, prev[left], left);
            push(&mut queue, &ids, left, next[left]);
        }
        (0..n).filter(|&i| alive[i]).map(|i| ids[i]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_apply_lowest_first_and_leftmost_on_ties() {
        // pieces: a=0 b=1 ab=2 bb=3 abb=4
        let pieces: Vec<String> = ["a", "b", "ab", "bb", "abb"].map(String::from).to_vec();
        let lookup = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        let ranks = HashMap::from([((1, 1), (0, 3)), ((0, 1), (1, 2)), ((2, 1), (2, 4))]);
        let m = Merges::Ranked(ranks);
        // "abb": "b b" has the lower rank, so "a bb" remains (no rule for it).
        assert_eq!(m.apply(&[0, 1, 1], &pieces, &lookup), vec![0, 3]);
        // "bbb": the leftmost "b b" merges first.
        assert_eq!(m.apply(&[1, 1, 1], &pieces, &lookup), vec![3, 1]);
        // "ab" then "ab b".
        assert_eq!(m.apply(&[0, 1], &pieces, &lookup), vec![2]);
    }

    #[test]
    fn scores_apply_highest_first() {
        let pieces: Vec<String> = ["a", "b", "ab", "bb"].map(String::from).to_vec();
        let lookup = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        let m = Merges::Scored(vec![0.0, 0.0, -1.0, -2.0]);
        assert_eq!(m.apply(&[0, 1, 1], &pieces, &lookup), vec![2, 1]);
        let m = Merges::Scored(vec![0.0, 0.0, -3.0, -2.0]);
        assert_eq!(m.apply(&[0, 1, 1], &pieces, &lookup), vec![0, 3]);
    }

    #[test]
    fn long_runs_are_fast() {
        // 200k identical symbols with a merge for every pair size: O(n log n), not O(n²).
        let mut pieces = vec![String::new()];
        let mut ranks = HashMap::new();
        for k in 0..17u32 {
            pieces.push("a".repeat(1 << (k + 1)));
            ranks.insert((k, k), (k, k + 1));
        }
        pieces[0] = "a".into();
        let lookup = HashMap::new();
        let out = Merges::Ranked(ranks).apply(&vec![0; 200_000], &pieces, &lookup);
        let total: usize = out.iter().map(|&i| 1usize << i).sum();
        assert_eq!(total, 200_000);
    }
}
