//! What a sequence's decode steps read besides the weights, kept on the device from one step
//! to the next: the token to embed, its position, the pool rows its keys and values go to,
//! the row table attention reads, and the sampler's number. Each step writes them in place
//! ([`webtensor::Tensor::write`]), so every step binds the same memory and a backend can replay a
//! recorded step ([`webtensor::backend::CapturedStep`]) instead of building its ops again.

use super::{CachePlan, KvCache};
use webtensor::backend::CapturedStep;
use webtensor::device::Device;
use webtensor::error::Result;
use webtensor::tensor::Tensor;

/// One sequence's decode inputs on each tensor-parallel rank's device, and its recorded step.
pub(crate) struct DecodeState {
    /// The id the step embeds, u32 `[1]` (on rank 0's device): written before the first step
    /// and copied from each step's draw.
    pub(crate) token: Tensor,
    /// The sampler's uniform number for the step, f32 `[1]` (rank 0).
    pub(crate) uniform: Tensor,
    /// Per rank: the new token's position, u32 `[1]`.
    positions: Vec<Tensor>,
    /// Per rank: the pool rows of the new token's keys and values, u32 `[kv_heads]`.
    write_rows: Vec<Tensor>,
    /// Per rank: the pool rows of every position the sequence can hold, u32
    /// `[kv_heads, capacity]`; attention reads the first `len` columns.
    read_rows: Vec<Tensor>,
    /// The block table `read_rows` was written for.
    written_table: Vec<usize>,
    /// The step recorded for replay, under the key of what it was recorded with.
    pub(crate) recorded: Option<Recorded>,
}

/// A recorded decode step and what it was recorded for.
pub(crate) struct Recorded {
    /// What the step depends on besides this state: the model, the sampling parameters, the
    /// activations (the engine's key).
    pub(crate) key: u64,
    /// The step and the id it draws (the memory its sampling writes), or `None` when the
    /// backend could not record it: the step then runs as ops, and is not tried again.
    pub(crate) step: Option<(CapturedStep, Tensor)>,
}

impl DecodeState {
    /// The inputs of `cache`'s decode steps on `devices` (its ranks' devices, rank order).
    pub(crate) fn new(devices: &[Device], cache: &KvCache) -> Result<DecodeState> {
        let heads = cache.pool.lock()?.kv_heads;
        let capacity = cache.capacity();
        let zeros =
            |d: &Device, n: usize, shape: &[usize]| Tensor::from_vec(d, vec![0u32; n], shape);
        let token = zeros(&devices[0], 1, &[1])?;
        let uniform = Tensor::from_vec(&devices[0], vec![0f32], [1])?;
        let per_rank = |n: usize, shape: &[usize]| -> Result<Vec<Tensor>> {
            devices.iter().map(|d| zeros(d, n, shape)).collect()
        };
        Ok(DecodeState {
            token,
            uniform,
            positions: per_rank(1, &[1])?,
            write_rows: per_rank(heads, &[heads])?,
            read_rows: per_rank(heads * capacity, &[heads, capacity])?,
            written_table: Vec::new(),
            recorded: None,
        })
    }

    /// Writes the inputs of the step that adds position `cache.len()` (its block already
    /// reserved) with the sampler's number `u`: its position, its pool rows, and the row table
    /// when the sequence's blocks changed since it was written.
    pub(crate) fn prepare(&mut self, cache: &KvCache, u: f32) -> Result<()> {
        let p = cache.len;
        let pool = cache.pool.lock()?;
        let (bs, slots, heads) = (pool.block_size, pool.slots(), pool.kv_heads);
        drop(pool);
        if self.written_table != cache.table {
            let capacity = cache.capacity();
            let held = (cache.table.len() * bs).min(capacity);
            let mut table = vec![0u32; heads * capacity];
            for (h, row) in table.chunks_mut(capacity).enumerate() {
                for (q, r) in row[..held].iter_mut().enumerate() {
                    *r = (h * slots + cache.slot(bs, q)) as u32;
                }
            }
            for rows in &mut self.read_rows {
                rows.write(&table)?;
            }
            self.written_table = cache.table.clone();
        }
        let slot = cache.slot(bs, p);
        let rows: Vec<u32> = (0..heads).map(|h| (h * slots + slot) as u32).collect();
        for (position, write_rows) in self.positions.iter_mut().zip(&mut self.write_rows) {
            position.write(&[p as u32])?;
            write_rows.write(&rows)?;
        }
        self.uniform.write(&[u])
    }

    /// The positions of the step, per rank.
    pub(crate) fn positions(&self) -> &[Tensor] {
        &self.positions
    }

    /// Where the step's keys and values go and come from: the state's own tables, of which
    /// attention reads `cache.len() + 1` columns.
    pub(crate) fn plan(&self, cache: &KvCache) -> CachePlan {
        CachePlan {
            write_rows: self.write_rows.clone(),
            read_rows: self.read_rows.clone(),
            len: cache.len + 1,
        }
    }
}
