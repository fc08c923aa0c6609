//! KV caches: the keys and values of the tokens each sequence has seen, in device memory
//! allocated once and written in place.
//!
//! A [`KvPool`] holds, per decoder layer, one key and one value tensor of
//! `[kv_heads · slots, head_dim]` (head-major: the rows of head `h` are `h · slots ..`). Its
//! slots are cut into blocks of `block_size` tokens. Each sequence has a [`KvCache`]: a block
//! table mapping its positions to slots (`slot(p) = table[p / block_size] · block_size +
//! p % block_size`). New keys and values are written at their slots with
//! [`ops::scatter_rows`]; attention ([`ops::paged_attention`]) reads a sequence's keys and
//! values in place through the list of its pool rows.
//!
//! Two layouts ([`CacheLayout`]): *static* gives each of `max_batch` sequences one block of
//! `max_len` tokens; *paged* hands out small blocks from a memory budget as sequences grow
//! and takes them back when a sequence is reset or dropped, so many sequences of unknown
//! length share the memory. A cache that cannot take more tokens is a typed error
//! ([`Error::CacheFull`], [`Error::CacheBlocksExhausted`]); nothing is overwritten.
//!
//! Sequences of one pool can share blocks (`blocks.rs`): a sequence offers its full blocks
//! with the ids they hold ([`KvCache::share`]), and a new sequence whose prompt begins with
//! those ids starts holding them ([`KvPool::sequence_sharing`]), reference-counted, so only the
//! rest of its prompt runs. A sequence about to write into a block another one reads (after
//! [`KvCache::truncate`] into it) writes into a copy (copy-on-write).

mod blocks;
mod decode;

use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) use decode::{DecodeState, Recorded};

use self::blocks::Blocks;
use super::LlamaConfig;
use webtensor::device::Device;
use webtensor::error::{Error, Result};
use webtensor::ops;
use webtensor::shape::Shape;
use webtensor::tensor::Tensor;

/// How a [`KvPool`] lays out its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// One region of `max_len` tokens for each of up to `max_batch` sequences at a time.
    Static {
        /// Sequences that can hold tokens at the same time.
        max_batch: usize,
        /// Tokens per sequence (at most the model's context).
        max_len: usize,
    },
    /// Blocks of `block_size` tokens handed to sequences as they grow, as many as
    /// `budget_bytes` of keys and values (all layers) hold.
    Paged {
        /// Tokens per block.
        block_size: usize,
        /// Device memory for keys and values, in bytes.
        budget_bytes: usize,
    },
}

/// Key and value memory shared by the sequences of one pool. Cloning shares the pool.
#[derive(Clone)]
pub struct KvPool {
    inner: Arc<Mutex<PoolMemory>>,
    /// Tokens one sequence may hold.
    seq_capacity: usize,
}

struct PoolMemory {
    /// Per tensor-parallel rank (one on a single device), per layer: that rank's keys and
    /// values on its device, `[kv_heads · slots, head_dim]` each. Every rank uses the same
    /// block tables.
    ranks: Vec<Vec<[Tensor; 2]>>,
    /// Key/value heads of one rank.
    kv_heads: usize,
    block_size: usize,
    blocks: usize,
    /// Who holds each block, the free ones, the ones kept for prompts that begin alike.
    book: Blocks,
}

impl PoolMemory {
    fn slots(&self) -> usize {
        self.blocks * self.block_size
    }

    /// Copies block `from`'s keys and values into block `to`, every layer and rank.
    fn copy_block(&mut self, from: usize, to: usize) -> Result<()> {
        let (bs, slots, heads) = (self.block_size, self.slots(), self.kv_heads);
        let rows = |block: usize| -> Vec<u32> {
            (0..heads)
                .flat_map(|h| (0..bs).map(move |i| (h * slots + block * bs + i) as u32))
                .collect()
        };
        let (from, to) = (rows(from), rows(to));
        for layers in &mut self.ranks {
            let Some([keys, _]) = layers.first() else {
                continue;
            };
            let device = keys.device().clone();
            let from = Tensor::from_slice(&device, &from, [from.len()])?;
            let to = Tensor::from_slice(&device, &to, [to.len()])?;
            for pair in layers.iter_mut() {
                for tensor in pair.iter_mut() {
                    let copied = ops::embedding(tensor, &from)?;
                    ops::scatter_rows(tensor, &to, &copied)?;
                }
            }
        }
        Ok(())
    }
}

impl KvPool {
    /// Allocates a pool for `config`'s layers, zero-filled: on one device, or split by
    /// key/value heads over the devices of a tensor-parallel model (rank `r`'s heads on
    /// `devices[r]`; their count divides the heads).
    pub(crate) fn new(
        devices: &[Device],
        config: &LlamaConfig,
        layout: CacheLayout,
    ) -> Result<KvPool> {
        let context = config.context_len();
        let ranks = devices.len().max(1);
        let (kv_heads, head_dim) = (config.kv_heads() / ranks, config.head_dim());
        let (block_size, blocks, seq_capacity) = match layout {
            CacheLayout::Static { max_batch, max_len } => {
                if max_batch == 0 || max_len == 0 || max_len > context {
                    return Err(Error::invalid(
                        "kv cache",
                        format!(
                            "a static cache needs max_batch ≥ 1 and max_len in 1..={context} (the \
                             model's context); got max_batch {max_batch}, max_len {max_len}"
                        ),
                    ));
                }
                (max_len, max_batch, max_len)
            }
            CacheLayout::Paged {
                block_size,
                budget_bytes,
            } => {
                // Keys and values of one token, all layers, as f32.
                let token_bytes = config
                    .num_hidden_layers
                    .saturating_mul(2)
                    .saturating_mul(config.kv_dim())
                    .saturating_mul(4);
                let block_bytes = block_size.saturating_mul(token_bytes).max(1);
                let blocks = budget_bytes / block_bytes;
                if block_size == 0 || blocks == 0 {
                    return Err(Error::invalid(
                        "kv cache",
                        format!(
                            "a paged cache needs block_size ≥ 1 and a budget of at least one \
                             block ({block_bytes} bytes for this model); got block_size \
                             {block_size}, budget {budget_bytes} bytes"
                        ),
                    ));
                }
                (block_size, blocks, context.min(blocks * block_size))
            }
        };
        let slots = blocks.checked_mul(block_size);
        let rows = slots.and_then(|s| s.checked_mul(kv_heads));
        let elements = rows.and_then(|r| r.checked_mul(head_dim));
        // Bytes on each device.
        let total = elements
            .and_then(|e| e.checked_mul(2 * 4))
            .and_then(|b| b.checked_mul(config.num_hidden_layers));
        let what = || {
            format!(
                "a KV cache of {} tokens for {} layers",
                slots.map_or("more than 2^64".into(), |s| s.to_string()),
                config.num_hidden_layers
            )
        };
        let hint = "ask for fewer tokens (a smaller max_len or max_batch, or a paged cache with \
                    a smaller budget)";
        let Some(total) = total else {
            return Err(Error::OutOfMemory {
                what: what(),
                bytes: u64::MAX,
                available: None,
                hint: hint.into(),
            });
        };
        for device in devices {
            let available = device.memory_available();
            if available.is_some_and(|a| total as u64 > a) {
                return Err(Error::OutOfMemory {
                    what: what(),
                    bytes: total as u64,
                    available,
                    hint: hint.into(),
                });
            }
        }
        // Rows are addressed by u32 slot tables (ops::scatter_rows, ops::embedding).
        let Some(rows) = rows.filter(|&r| u32::try_from(r).is_ok()) else {
            return Err(Error::invalid(
                "kv cache",
                format!("{} needs more than 2^32 rows per layer; {hint}", what()),
            ));
        };
        // A layer's keys and values allocated together, so that a device whose decode step
        // stores both in one dispatch can (`ops::rms_norm_linears_into`).
        let layers = |device: &Device| {
            let shape = Shape::from([rows, head_dim]);
            (0..config.num_hidden_layers)
                .map(|_| {
                    let [keys, values]: [Tensor; 2] =
                        Tensor::zeros_group(device, &[shape.clone(), shape.clone()])?
                            .try_into()
                            .map_err(|_| Error::invalid("kv cache", "two pool tensors expected"))?;
                    Ok([keys, values])
                })
                .collect::<Result<Vec<_>>>()
        };
        let ranks = devices.iter().map(layers).collect::<Result<Vec<_>>>()?;
        Ok(KvPool {
            inner: Arc::new(Mutex::new(PoolMemory {
                ranks,
                kv_heads,
                block_size,
                blocks,
                book: Blocks::new(blocks),
            })),
            seq_capacity,
        })
    }

    /// A new, empty sequence. It takes blocks as it grows and gives them back when reset or
    /// dropped.
    pub fn sequence(&self) -> KvCache {
        KvCache {
            pool: self.clone(),
            table: Vec::new(),
            len: 0,
            decode: None,
        }
    }

    /// A new sequence that holds the blocks of this pool already computed for the start of
    /// `prompt` (offered by [`KvCache::share`]): whole blocks only, and short of `prompt`'s last
    /// id, whose logits the next pass must compute. Its [`KvCache::len`] is how many ids of
    /// `prompt` it holds; the pass runs the ids after them. A block that matches `prompt` only
    /// in part is not taken: its ids run again.
    pub fn sequence_sharing(&self, prompt: &[u32]) -> Result<KvCache> {
        let mut pool = self.lock()?;
        let bs = pool.block_size;
        let max_blocks = prompt.len().saturating_sub(1) / bs;
        let table = pool.book.lookup(prompt, bs, max_blocks);
        for &b in &table {
            pool.book.hold(b);
        }
        drop(pool);
        let len = table.len() * bs;
        Ok(KvCache {
            pool: self.clone(),
            table,
            len,
            decode: None,
        })
    }

    /// Blocks a sequence can take: those no sequence holds (free, or kept for prompts that
    /// begin alike, which are evicted when the pool needs them).
    pub fn free_blocks(&self) -> Result<usize> {
        Ok(self.lock()?.book.available())
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> Result<usize> {
        Ok(self.lock()?.blocks)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> Result<usize> {
        Ok(self.lock()?.block_size)
    }

    fn lock(&self) -> Result<MutexGuard<'_, PoolMemory>> {
        self.inner
            .lock()
            .map_err(|_| Error::invalid("kv cache", "the cache's lock was poisoned by a panic"))
    }

    fn same(&self, other: &KvPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// One sequence's keys and values: a block table into a [`KvPool`] and the tokens held.
pub struct KvCache {
    pool: KvPool,
    /// Block ids, in position order.
    table: Vec<usize>,
    len: usize,
    /// What its decode steps read, once it has decoded (see [`DecodeState`]).
    decode: Option<Box<DecodeState>>,
}

impl KvCache {
    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens it can hold (the pool may run out of blocks before, when shared).
    pub fn capacity(&self) -> usize {
        self.pool.seq_capacity
    }

    /// The pool it takes blocks from.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Forgets every token and gives its blocks back to the pool (a new sequence).
    pub fn reset(&mut self) {
        self.release();
        self.len = 0;
    }

    /// Keeps the first `len` tokens (fewer than held, or all) and gives the blocks past them
    /// back to the pool: the next token written goes to position `len`. A conversation's
    /// cache is cut back to the prompt it shares with the next turn this way.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        let block_size = self.pool.block_size()?;
        let kept = len.div_ceil(block_size);
        let mut pool = self.pool.lock()?;
        for b in self.table.drain(kept..) {
            pool.book.release(b);
        }
        self.len = len;
        Ok(())
    }

    /// Offers this sequence's full blocks to the sequences made later by
    /// [`KvPool::sequence_sharing`]: `ids` are the ids it holds from position 0 (those past
    /// [`KvCache::len`] are ignored). Its blocks stay its own to read; they are kept for others
    /// after it ends, until the pool needs them.
    pub fn share(&self, ids: &[u32]) -> Result<()> {
        let mut pool = self.pool.lock()?;
        let bs = pool.block_size;
        let ids = &ids[..ids.len().min(self.len)];
        pool.book.publish(&self.table, ids, bs);
        Ok(())
    }

    fn release(&mut self) {
        if let Ok(mut pool) = self.pool.lock() {
            for b in self.table.drain(..) {
                pool.book.release(b);
            }
        }
        self.table.clear();
    }

    /// The block the next token is written into when it is a block already held, part full.
    fn partial_block(&self, block_size: usize) -> Option<usize> {
        (!self.len.is_multiple_of(block_size)).then(|| self.len / block_size)
    }

    /// Fails with [`Error::CacheFull`] unless `tokens` more fit this sequence.
    pub(crate) fn check_room(&self, tokens: usize) -> Result<()> {
        if self.len + tokens > self.capacity() {
            return Err(Error::CacheFull {
                capacity: self.capacity(),
                len: self.len,
                requested: tokens,
            });
        }
        Ok(())
    }

    /// Blocks needed beyond those held for `tokens` more: one more when the part-full block
    /// written first is another sequence's too (it is copied).
    fn blocks_needed(&self, book: &Blocks, block_size: usize, tokens: usize) -> usize {
        let copy = self
            .partial_block(block_size)
            .filter(|&i| tokens > 0 && book.held_by_others(self.table[i]));
        (self.len + tokens)
            .div_ceil(block_size)
            .saturating_sub(self.table.len())
            + usize::from(copy.is_some())
    }

    /// Before `tokens` more are written: a part-full block they go into that another sequence
    /// holds is replaced by a copy of its own (from `fresh`), and one that is only indexed is
    /// taken out of the index.
    fn own_partial_block(&mut self, pool: &mut PoolMemory, tokens: usize) -> Result<()> {
        let bs = pool.block_size;
        let Some(i) = self.partial_block(bs).filter(|_| tokens > 0) else {
            return Ok(());
        };
        let old = self.table[i];
        if !pool.book.shared(old) {
            return Ok(());
        }
        if !pool.book.held_by_others(old) {
            pool.book.forget(old);
            return Ok(());
        }
        let Some(new) = pool.book.take() else {
            return Err(Error::CacheBlocksExhausted {
                block_size: bs,
                free: 0,
                needed: 1,
            });
        };
        pool.copy_block(old, new)?;
        pool.book.release(old);
        self.table[i] = new;
        Ok(())
    }

    /// Decoder layers the pool holds.
    pub(crate) fn layers(&self) -> usize {
        self.pool
            .lock()
            .map_or(0, |p| p.ranks.first().map_or(0, Vec::len))
    }

    /// The devices of the pool's ranks (one on a single device), or `None` when empty.
    pub(crate) fn rank_devices(&self) -> Vec<Device> {
        self.pool.lock().map_or(Vec::new(), |p| {
            p.ranks
                .iter()
                .filter_map(|layers| layers.first().map(|[k, _]| k.device().clone()))
                .collect()
        })
    }

    /// Records that `tokens` more were written (their blocks reserved).
    pub(crate) fn advance(&mut self, tokens: usize) {
        self.len += tokens;
    }

    /// Records that the pass of `plan` wrote its tokens.
    pub(crate) fn advance_to(&mut self, plan: &CachePlan) {
        self.len = plan.len;
    }

    /// Whether this sequence's decode steps replay a step recorded at its first one
    /// ([`webtensor::backend::CapturedStep`]; the wgpu backend), rather than run as ops: the
    /// host then records each step's kernels from a list built once.
    pub fn decode_is_replayed(&self) -> bool {
        self.decode
            .as_ref()
            .and_then(|d| d.recorded.as_ref())
            .is_some_and(|r| r.step.is_some())
    }

    /// Takes the sequence's decode state out (to be put back with
    /// [`KvCache::put_decode_state`]), or `None` before its first decode step.
    pub(crate) fn take_decode_state(&mut self) -> Option<Box<DecodeState>> {
        self.decode.take()
    }

    /// Keeps `state` for the next decode steps.
    pub(crate) fn put_decode_state(&mut self, state: Box<DecodeState>) {
        self.decode = Some(state);
    }

    /// Whether both caches take blocks from the same pool.
    pub(crate) fn shares_pool(&self, other: &KvCache) -> bool {
        self.pool.same(&other.pool)
    }

    /// The slot of position `p` (which must be within the table).
    fn slot(&self, block_size: usize, p: usize) -> usize {
        self.table[p / block_size] * block_size + p % block_size
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        self.release();
    }
}

/// Takes blocks for `tokens[i]` more tokens of each sequence, all or none: fails with
/// [`Error::CacheFull`] or [`Error::CacheBlocksExhausted`] and takes nothing when one does not
/// fit.
pub(crate) fn reserve(caches: &mut [(usize, &mut KvCache)]) -> Result<()> {
    for (t, cache) in caches.iter() {
        cache.check_room(*t)?;
    }
    // Sequences of one pool draw on the same free list: count their needs together, once per
    // pool (at its first sequence).
    for (i, (_, cache)) in caches.iter().enumerate() {
        if caches[..i].iter().any(|(_, c)| c.shares_pool(cache)) {
            continue;
        }
        let pool = cache.pool.lock()?;
        let needed: usize = caches
            .iter()
            .filter(|(_, c)| c.shares_pool(cache))
            .map(|(t, c)| c.blocks_needed(&pool.book, pool.block_size, *t))
            .sum();
        let free = pool.book.available();
        if needed > free {
            return Err(Error::CacheBlocksExhausted {
                block_size: pool.block_size,
                free,
                needed,
            });
        }
    }
    for (t, cache) in caches.iter_mut() {
        let pool = cache.pool.clone();
        let mut pool = pool.lock()?;
        cache.own_partial_block(&mut pool, *t)?;
        let grow = (cache.len + *t)
            .div_ceil(pool.block_size)
            .saturating_sub(cache.table.len());
        for _ in 0..grow {
            let b = pool.book.take().ok_or(Error::CacheBlocksExhausted {
                block_size: pool.block_size,
                free: 0,
                needed: grow,
            })?;
            cache.table.push(b);
        }
    }
    Ok(())
}

/// Where one sequence's keys and values go and come from in one forward pass: the same for
/// every layer, so it is built once per pass.
pub(crate) struct CachePlan {
    /// Per rank: rows of the pool tensors the new tokens' keys are written to, head-major
    /// (`[kv_heads · t]`), on the rank's device.
    write_rows: Vec<Tensor>,
    /// Per rank: the pool rows of all the sequence's keys after the pass, `[kv_heads, ≥ len]`
    /// (the first `len` columns are read).
    read_rows: Vec<Tensor>,
    /// Tokens held after the pass.
    len: usize,
}

impl CachePlan {
    /// The plan for `t` new tokens after those `cache` holds (its blocks already reserved),
    /// its row tables on each rank's device.
    pub(crate) fn new(devices: &[Device], cache: &KvCache, t: usize) -> Result<CachePlan> {
        let pool = cache.pool.lock()?;
        let (bs, slots, heads) = (pool.block_size, pool.slots(), pool.kv_heads);
        let len = cache.len + t;
        let head_major = |positions: std::ops::Range<usize>| -> Vec<u32> {
            (0..heads)
                .flat_map(|h| positions.clone().map(move |p| (h, p)))
                .map(|(h, p)| (h * slots + cache.slot(bs, p)) as u32)
                .collect()
        };
        let on_each = |rows: Vec<u32>, shape: &[usize]| -> Result<Vec<Tensor>> {
            devices
                .iter()
                .map(|d| Tensor::from_slice(d, &rows, shape))
                .collect()
        };
        Ok(CachePlan {
            write_rows: on_each(head_major(cache.len..len), &[heads * t])?,
            read_rows: on_each(head_major(0..len), &[heads, len])?,
            len,
        })
    }

    /// Writes one layer's new keys and values of tensor-parallel rank `rank` (its heads,
    /// `[kv_heads, t, head_dim]` each) into the pool and returns
    /// `attend((keys, values), (rows, len))`: attention over that layer's and rank's pool
    /// tensors (`[kv_heads · slots, head_dim]`), read in place through the first `len` columns
    /// of `rows` (`[kv_heads, ≥ len]`), the pool rows of all the sequence's keys.
    pub(crate) fn write_and_attend(
        &self,
        cache: &KvCache,
        (rank, layer): (usize, usize),
        (k, v): (&Tensor, &Tensor),
        attend: impl FnOnce((&Tensor, &Tensor), (&Tensor, usize)) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let write = |keys: &mut Tensor, values: &mut Tensor, write_rows: &Tensor| {
            let (rows, hd) = (write_rows.dims()[0], keys.dims()[1]);
            ops::scatter_rows(keys, write_rows, &k.reshape([rows, hd])?)?;
            ops::scatter_rows(values, write_rows, &v.reshape([rows, hd])?)
        };
        self.store_and_attend(cache, (rank, layer), write, attend)
    }

    /// [`CachePlan::write_and_attend`] with the writing left to `write(keys, values,
    /// write_rows)`: the layer's and rank's pool tensors, and the pool rows of the new keys and
    /// values (`[kv_heads · t]`, heads-first) to write in place (the decode products that make
    /// them store them there: `ops::rms_norm_linears_into`).
    pub(crate) fn store_and_attend(
        &self,
        cache: &KvCache,
        (rank, layer): (usize, usize),
        write: impl FnOnce(&mut Tensor, &mut Tensor, &Tensor) -> Result<()>,
        attend: impl FnOnce((&Tensor, &Tensor), (&Tensor, usize)) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let mut pool = cache.pool.lock()?;
        let [keys, values] = &mut pool.ranks[rank][layer];
        write(keys, values, &self.write_rows[rank])?;
        attend((keys, values), (&self.read_rows[rank], self.len))
    }
}

#[cfg(test)]
mod tests;
