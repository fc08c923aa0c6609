//! Shared blocks on the built-in model: a sequence that starts from another one's blocks
//! computes exactly the logits it computes alone, and writing after a shared block leaves the
//! other sequence's keys and values as they were.

use super::*;
use crate::{builtin, Llama};

const BLOCK: usize = 4;

fn model_and_pool() -> (Llama, KvPool) {
    let model = Llama::load(&Device::cpu(), builtin::files().unwrap()).unwrap();
    let layout = CacheLayout::Paged {
        block_size: BLOCK,
        budget_bytes: 64 * BLOCK * 2 * model.config.num_hidden_layers * model.config.kv_dim() * 4,
    };
    let pool = model.new_pool(layout).unwrap();
    (model, pool)
}

/// The logits of `ids`' last position, computed by a sequence of its own.
fn alone(model: &Llama, pool: &KvPool, ids: &[u32]) -> Vec<f32> {
    let mut seq = pool.sequence();
    last_row(&model.forward(ids, &mut seq).unwrap())
}

fn last_row(logits: &Tensor) -> Vec<f32> {
    let v = logits.to_vec::<f32>().unwrap();
    let vocab = logits.dims()[1];
    v[v.len() - vocab..].to_vec()
}

#[test]
fn a_prompt_that_begins_like_another_reuses_its_full_blocks_with_the_same_logits() {
    let (model, pool) = model_and_pool();
    let a: Vec<u32> = (1..=11).collect();
    let mut b = a[..9].to_vec();
    b.extend([40, 41, 42]);
    let mut first = pool.sequence();
    model.forward(&a, &mut first).unwrap();
    first.share(&a).unwrap();
    let used = pool.total_blocks().unwrap() - pool.free_blocks().unwrap();

    let mut second = pool.sequence_sharing(&b).unwrap();
    // Two full blocks (8 ids) are shared; the third matches in part and runs again.
    assert_eq!(second.len(), 2 * BLOCK);
    let shared = last_row(&model.forward(&b[2 * BLOCK..], &mut second).unwrap());
    assert_eq!(shared, alone(&model, &pool, &b), "bit for bit");
    // The second sequence took one block of its own (ids 8..12), not three.
    assert_eq!(
        pool.total_blocks().unwrap() - pool.free_blocks().unwrap(),
        used + 1
    );

    // The same prompt again: all its full blocks short of the last id.
    let again = pool.sequence_sharing(&a).unwrap();
    assert_eq!(again.len(), 2 * BLOCK);
    let exact = pool.sequence_sharing(&a[..9]).unwrap();
    assert_eq!(exact.len(), 2 * BLOCK);
    let short = pool.sequence_sharing(&a[..8]).unwrap();
    assert_eq!(short.len(), BLOCK, "the last id must run");
}

#[test]
fn writing_into_a_shared_block_writes_a_copy() {
    let (model, pool) = model_and_pool();
    let a: Vec<u32> = (1..=9).collect();
    let mut first = pool.sequence();
    model.forward(&a, &mut first).unwrap();
    first.share(&a).unwrap();
    let mut second = pool.sequence_sharing(&a).unwrap();
    assert_eq!(second.len(), 2 * BLOCK);
    // Cut back into the second shared block and write other ids there.
    second.truncate(6).unwrap();
    let mut b = a[..6].to_vec();
    b.extend([50, 51, 52]);
    let logits = last_row(&model.forward(&b[6..], &mut second).unwrap());
    assert_eq!(logits, alone(&model, &pool, &b));
    // The first sequence reads its own keys still: its next token's logits are those of
    // its prompt run alone.
    let mut longer = a.clone();
    longer.push(60);
    let next = last_row(&model.forward(&[60], &mut first).unwrap());
    assert_eq!(next, alone(&model, &pool, &longer));
}

#[test]
fn cached_blocks_make_room_for_a_sequence_that_needs_the_whole_pool() {
    let (model, pool) = model_and_pool();
    let total = pool.total_blocks().unwrap();
    let a: Vec<u32> = (1..=9).collect();
    {
        let mut first = pool.sequence();
        model.forward(&a, &mut first).unwrap();
        first.share(&a).unwrap();
    }
    // Its blocks are kept for later prompts, yet count as free.
    assert_eq!(pool.free_blocks().unwrap(), total);
    assert_eq!(pool.sequence_sharing(&a).unwrap().len(), 2 * BLOCK);
    let mut whole = pool.sequence();
    let mut all = vec![(total * BLOCK, &mut whole)];
    reserve(&mut all).unwrap();
    assert_eq!(pool.free_blocks().unwrap(), 0);
    drop(whole);
    assert_eq!(pool.sequence_sharing(&a).unwrap().len(), 0, "evicted");
}
