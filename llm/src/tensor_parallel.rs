//! Tensor parallelism: one model split over several devices, Megatron-style.
//!
//! Each of `size` ranks holds, on its own device, `1/size` of every decoder layer: the query,
//! key and value projections split by heads (rows of the stored `[out, in]` matrices), the
//! output projection split by the same heads (its columns), the gate and up projections split
//! by FFN columns (rows) and the down projection by the same columns (its columns); norms are
//! replicated. A rank computes its heads' attention over its own KV cache (on its device) and
//! a partial output projection; one [`Collective::all_reduce_sum`] adds the partials, and the
//! same again after the FFN's down projection. The residual stream is replicated on every
//! rank; the embedding, the final norm, the output head and sampling live on rank 0, whose
//! embedding rows are [`Collective::broadcast`] at the start of each pass. With one rank the
//! collective does nothing, so the single-device engine is the same code.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use webtensor::backend::{BackendKind, BackendOptions};
use webtensor::device::Device;
use webtensor::error::{Error, Result};
use webtensor::tensor::Tensor;

use super::arch::QkNorm;
use super::LlamaConfig;

/// How many devices a model is split over ([`crate::Llama::load_parallel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpConfig {
    /// Ranks: one per device. It must divide the attention heads, the key/value heads and the
    /// FFN width.
    pub size: usize,
}

impl TpConfig {
    /// Fails with [`Error::TpIndivisible`] unless `size` splits `config`'s heads, key/value
    /// heads and FFN width evenly (and is at least 1), and is 1 for OLMo 2, whose q/k norms
    /// span every head.
    pub fn check(&self, config: &LlamaConfig) -> Result<()> {
        let size = self.size;
        let parts = [
            ("attention heads", config.num_attention_heads),
            ("key/value heads", config.kv_heads()),
            ("FFN columns (intermediate_size)", config.intermediate_size),
        ];
        // OLMo 2 norms q and k over all heads together: one group, which cannot be split.
        let qk_groups = ("q/k RMS norm groups (OLMo 2 norms all heads together)", 1);
        let whole_qk = config.architecture.qk_norm() == QkNorm::Whole;
        for (what, count) in whole_qk.then_some(qk_groups).into_iter().chain(parts) {
            if size == 0 || !count.is_multiple_of(size) {
                return Err(Error::TpIndivisible {
                    size,
                    what: what.to_string(),
                    count,
                });
            }
        }
        Ok(())
    }
}

/// The harness clock as a `Duration` since its start (native and browser alike).
fn now() -> Duration {
    Duration::from_secs_f64(webtensor::bench::clock::now_secs())
}

/// `n` devices for a split: separate logical devices of `kind` (its own queue and memory
/// each, on one adapter or several), each with the cpu as fallback for ops `kind` lacks; for
/// the host backends, `n` handles of the shared one. Each is started with `options`.
pub fn devices_of(kind: BackendKind, n: usize, options: &BackendOptions) -> Result<Vec<Device>> {
    let mut priority = vec![kind];
    if !kind.is_host() {
        priority.push(BackendKind::Cpu);
    }
    (0..n)
        .map(|_| {
            Device::builder()
                .priority(priority.clone())
                .strict(true)
                .separate(true)
                .options(options.clone())
                .build()
        })
        .collect()
}

/// One rank's part of a split: which slice of each split dimension it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shard {
    pub rank: usize,
    pub size: usize,
}

impl Shard {
    /// This rank's part of `total` (which the size divides).
    pub fn range(&self, total: usize) -> Range<usize> {
        let part = total / self.size;
        part * self.rank..part * (self.rank + 1)
    }

    /// Whether this rank holds the unsplit tensors (embedding, output head).
    pub fn is_first(&self) -> bool {
        self.rank == 0
    }
}

/// Time spent in a collective's calls, for `bench --model --tp`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CollectiveStats {
    /// All-reduces and broadcasts run.
    pub calls: u64,
    /// Time waiting for the ranks' queued work to finish before the data could move.
    pub wait: Duration,
    /// Time moving and adding the data itself.
    pub transfer: Duration,
}

/// The communication between the ranks of a tensor-parallel model.
///
/// `parts[r]` (and the `r`-th returned tensor) lives on rank `r`'s device. A collective is
/// made for one ordered list of devices and answers for those ranks only; it may keep the work
/// on the devices (device-to-device copies, or NCCL on one CUDA stream per rank, where the
/// call only enqueues) or move it through the host. A multi-host communicator stands behind
/// the same interface: each process passes its local ranks' parts, and the library behind it
/// (NCCL over the network) reduces with the other processes' ranks.
pub trait Collective: Send + Sync {
    /// A short name for reports (`host`, `nccl`).
    fn name(&self) -> &'static str;

    /// The element-wise sum of `parts` (f32, one shape), a copy on every rank. The sum is
    /// taken in rank order so every rank gets the same bits.
    fn all_reduce_sum(&self, parts: &[Tensor]) -> Result<Vec<Tensor>>;

    /// Rank 0's `x`, a copy on every rank (the first is `x` itself).
    fn broadcast(&self, x: &Tensor) -> Result<Vec<Tensor>>;

    /// Time spent so far.
    fn stats(&self) -> CollectiveStats;
}

/// The collective through host memory: every part is read back, summed on the host in rank
/// order, and the sum uploaded to each device. It works for any mix of devices (cpu, wgpu,
/// separate logical devices of one adapter), at the cost of a device synchronization per
/// call. Each rank's readback waits in its own thread, so the devices run their queued work
/// at the same time.
pub struct HostCollective {
    devices: Vec<Device>,
    calls: AtomicU64,
    wait_ns: AtomicU64,
    transfer_ns: AtomicU64,
}

impl HostCollective {
    /// The collective over `devices`, rank `r` on `devices[r]`.
    pub fn new(devices: &[Device]) -> HostCollective {
        HostCollective {
            devices: devices.to_vec(),
            calls: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            transfer_ns: AtomicU64::new(0),
        }
    }

    fn record(&self, wait: Duration, transfer: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.wait_ns
            .fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
        self.transfer_ns
            .fetch_add(transfer.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Waits for every rank's queued work, each in its own thread; a failure names its rank.
    fn synchronize(&self) -> Result<()> {
        let sync =
            |(rank, d): (usize, &Device)| d.synchronize().map_err(|e| shard_failed(rank, d, e));
        // Host backends have nothing queued: threads would only cost their start.
        let queued = self
            .devices
            .iter()
            .filter(|d| !d.primary().kind().is_host())
            .count();
        #[cfg(not(target_arch = "wasm32"))]
        if queued > 1 {
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .devices
                    .iter()
                    .enumerate()
                    .map(|rd| s.spawn(move || sync(rd)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::invalid("tp", "a rank's thread panicked"))
                        })
                    })
                    .collect::<Result<Vec<()>>>()
            })?;
        }
        if queued <= 1 || cfg!(target_arch = "wasm32") {
            self.devices.iter().enumerate().try_for_each(sync)?;
        }
        Ok(())
    }

    fn check_ranks(&self, parts: usize) -> Result<()> {
        if parts != self.devices.len() {
            return Err(Error::invalid(
                "all_reduce",
                format!(
                    "{parts} parts for a collective of {} ranks",
                    self.devices.len()
                ),
            ));
        }
        Ok(())
    }
}

/// The error of rank `rank` on `device`, wrapped so it says which rank failed.
pub(crate) fn shard_failed(rank: usize, device: &Device, source: Error) -> Error {
    Error::ShardFailed {
        rank,
        backend: device.primary().kind(),
        source: Box::new(source),
    }
}

impl Collective for HostCollective {
    fn name(&self) -> &'static str {
        "host"
    }

    fn all_reduce_sum(&self, parts: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_ranks(parts.len())?;
        if parts.len() == 1 {
            return Ok(parts.to_vec());
        }
        let start = now();
        self.synchronize()?;
        let waited = now();
        let mut sum: Vec<f32> = Vec::new();
        for (rank, (part, device)) in parts.iter().zip(&self.devices).enumerate() {
            let v: Vec<f32> = part.to_vec().map_err(|e| shard_failed(rank, device, e))?;
            if sum.is_empty() {
                sum = v;
            } else {
                sum.iter_mut().zip(&v).for_each(|(s, x)| *s += x);
            }
        }
        let shape = parts[0].shape().clone();
        let out = self
            .devices
            .iter()
            .enumerate()
            .map(|(rank, d)| {
                Tensor::from_slice(d, &sum, shape.clone()).map_err(|e| shard_failed(rank, d, e))
            })
            .collect::<Result<Vec<_>>>()?;
        let end = now();
        self.record(waited - start, end - waited);
        Ok(out)
    }

    fn broadcast(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        if self.devices.len() == 1 {
            return Ok(vec![x.clone()]);
        }
        let start = now();
        let host: Vec<f32> = x
            .to_vec()
            .map_err(|e| shard_failed(0, &self.devices[0], e))?;
        let mut out = vec![x.clone()];
        for (rank, d) in self.devices.iter().enumerate().skip(1) {
            out.push(
                Tensor::from_slice(d, &host, x.shape().clone())
                    .map_err(|e| shard_failed(rank, d, e))?,
            );
        }
        self.record(Duration::ZERO, now() - start);
        Ok(out)
    }

    fn stats(&self) -> CollectiveStats {
        CollectiveStats {
            calls: self.calls.load(Ordering::Relaxed),
            wait: Duration::from_nanos(self.wait_ns.load(Ordering::Relaxed)),
            transfer: Duration::from_nanos(self.transfer_ns.load(Ordering::Relaxed)),
        }
    }
}
