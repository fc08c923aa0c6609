//! Ceilings measured in the same run as the ops: what the hardware can do at best, so each
//! op's figure is a fraction of something real rather than a bare number.

use serde::Serialize;

use super::clock::now_secs;
use super::Size;
use crate::backend::{BackendKind, BackendRef, HostData, Storage};
use crate::error::Result;

/// The ceilings of one backend.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct Ceilings {
    /// Device-to-device copy bandwidth (bytes read + written per second), in GB/s; on the
    /// cpu, host memory copied by every worker thread between buffers already in memory.
    pub copy_gb_per_s: f64,
    /// Bytes copied per probe iteration.
    pub copy_bytes: u64,
    /// The fastest a kernel of the backend streams a buffer it only reads (bytes read per
    /// second), in GB/s, from a probe shaped like its decode products (wgpu only: see
    /// `shaders/read_probe.wgsl`). A buffer copy is the driver's own memcpy on software
    /// adapters, which no shader matches there, so the products are also put against this.
    #[serde(default)]
    pub read_gb_per_s: Option<f64>,
    /// Peak f32 FMA throughput (2 FLOPs per FMA) over all threads, in GFLOP/s (cpu only).
    pub fma_gflop_per_s: Option<f64>,
}

/// Measures the ceilings of `backend` (blocking; see [`measure_async`]).
#[cfg(not(target_arch = "wasm32"))]
pub fn measure(backend: &BackendRef, size: Size) -> Result<Ceilings> {
    pollster::block_on(measure_async(backend, size))
}

/// Measures the ceilings of `backend`, waiting for the device without blocking.
pub async fn measure_async(backend: &BackendRef, size: Size) -> Result<Ceilings> {
    let elems = probe_elems(backend, size);
    let (copy_gb_per_s, read_gb_per_s) = if backend.kind() == BackendKind::Cpu {
        (host_copy_bandwidth(elems), None)
    } else {
        // One source buffer for both probes.
        let source = backend.upload(HostData::F32(vec![1.0; elems]))?;
        (
            copy_bandwidth(backend, &source, elems).await?,
            read_bandwidth(backend, &source).await?,
        )
    };
    let fma_gflop_per_s = (backend.kind() == BackendKind::Cpu).then(fma_peak_gflops);
    Ok(Ceilings {
        copy_gb_per_s,
        copy_bytes: (elems * 8) as u64,
        read_gb_per_s,
        fma_gflop_per_s,
    })
}

/// The f32 values the bandwidth probes stream: 64 MiB (`small`) or 256 MiB (`medium`), but
/// no more than one binding or buffer of the device holds (128 MiB on lavapipe and in many
/// browsers), since the copy's output and the read probe's input are each bound whole.
fn probe_elems(backend: &BackendRef, size: Size) -> usize {
    let wanted: usize = match size {
        Size::Small => 16 << 20,
        Size::Medium => 64 << 20,
    };
    let one_binding = backend
        .info()
        .limits
        .iter()
        .filter(|(name, _)| name == "max_storage_buffer_binding_size" || name == "max_buffer_size")
        .map(|&(_, bytes)| usize::try_from(bytes / 4).unwrap_or(usize::MAX))
        .min()
        .unwrap_or(usize::MAX);
    wanted.min(one_binding)
}

/// Best of several timed passes of the backend's read probe over `source`, or `None` for a
/// backend without one.
async fn read_bandwidth(backend: &BackendRef, source: &Storage) -> Result<Option<f64>> {
    let Some((_, bytes)) = backend.read_probe(source)? else {
        return Ok(None);
    };
    let secs = best_pass_secs(backend, || backend.read_probe(source).map(drop)).await?;
    Ok(Some(bytes as f64 / secs / 1e9))
}

/// Best of several timed copies of the `elems` f32 values of `source`.
async fn copy_bandwidth(backend: &BackendRef, source: &Storage, elems: usize) -> Result<f64> {
    backend.copy(source, elems)?;
    let secs = best_pass_secs(backend, || backend.copy(source, elems).map(drop)).await?;
    Ok((elems * 8) as f64 / secs / 1e9)
}

/// The shortest time per `pass` over five timings of four passes each, after waiting for the
/// work already recorded (the caller's warm-up pass).
async fn best_pass_secs(backend: &BackendRef, pass: impl Fn() -> Result<()>) -> Result<f64> {
    backend.synchronize_async().await?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = now_secs();
        let iters = 4;
        for _ in 0..iters {
            pass()?;
        }
        backend.synchronize_async().await?;
        best = best.min((now_secs() - start) / iters as f64);
    }
    Ok(best)
}

/// The cpu's copy ceiling: every worker thread copies its share of `elems` f32 values
/// between two buffers filled beforehand, best of several. The cpu backend's own `copy`
/// allocates its output, and the page faults of that fresh memory made the ceiling read
/// several times too low (decode weight traffic came out at 129–620% of it).
fn host_copy_bandwidth(elems: usize) -> f64 {
    let src = vec![1f32; elems];
    let threads = on_every_thread(|| 1.0).len().max(1);
    let share = elems.div_ceil(threads);
    let dst: Vec<std::sync::Mutex<Vec<f32>>> = (0..threads)
        .map(|t| std::sync::Mutex::new(vec![0f32; share.min(elems.saturating_sub(t * share))]))
        .collect();
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        let start = now_secs();
        on_every_thread_indexed(|t| {
            if let Some(Ok(mut d)) = dst.get(t).map(|d| d.lock()) {
                let n = d.len();
                d.copy_from_slice(&src[t * share..t * share + n]);
                std::hint::black_box(&mut d[..]);
            }
        });
        best = best.min(now_secs() - start);
    }
    (elems * 8) as f64 / best / 1e9
}

/// Runs `f(thread_index)` once on every worker thread.
#[cfg(not(target_arch = "wasm32"))]
fn on_every_thread_indexed(f: impl Fn(usize) + Sync) {
    rayon::broadcast(|ctx| f(ctx.index()));
}

#[cfg(target_arch = "wasm32")]
fn on_every_thread_indexed(f: impl Fn(usize) + Sync) {
    f(0)
}

/// FMA throughput over every worker thread, best of three.
fn fma_peak_gflops() -> f64 {
    const ITERS: u64 = 20_000_000;
    let mut best = 0f64;
    for _ in 0..3 {
        let start = now_secs();
        let flops_per_thread = on_every_thread(|| fma_loop(ITERS));
        let total: f64 = flops_per_thread.iter().sum();
        best = best.max(total / (now_secs() - start) / 1e9);
    }
    best
}

#[cfg(not(target_arch = "wasm32"))]
fn on_every_thread(f: impl Fn() -> f64 + Sync) -> Vec<f64> {
    rayon::broadcast(|_| f())
}

#[cfg(target_arch = "wasm32")]
fn on_every_thread(f: impl Fn() -> f64 + Sync) -> Vec<f64> {
    vec![f()]
}

/// Runs `iters` rounds of independent FMAs on the widest vector unit and returns the FLOPs done.
fn fma_loop(iters: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { x86::fma_avx512(iters / 2) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA, checked just above.
            return unsafe { x86::fma_avx2(iters) };
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        return wasm::mul_add_simd128(iters);
    }
    #[allow(unreachable_code)]
    fma_scalar(iters / 8)
}

/// Eight independent scalar FMA chains (the compiler may vectorise them; that is fine).
fn fma_scalar(iters: u64) -> f64 {
    let mut acc = [1.0f32, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7];
    let (a, b) = (
        std::hint::black_box(0.999_999f32),
        std::hint::black_box(1e-7f32),
    );
    for _ in 0..iters {
        for v in &mut acc {
            *v = v.mul_add(a, b);
        }
    }
    std::hint::black_box(acc);
    (iters * 8 * 2) as f64
}

/// wasm has no fused multiply-add (outside relaxed-simd), and `f32::mul_add` there is a slow
/// software routine, so the wasm peak is that of separate 4-wide multiplies and adds: what the
/// cpu backend's simd128 kernels use.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;

    /// Eight independent 4-wide multiply-add chains (2 FLOPs per lane per step).
    pub(super) fn mul_add_simd128(iters: u64) -> f64 {
        let a = f32x4_splat(std::hint::black_box(0.999_999));
        let b = f32x4_splat(std::hint::black_box(1e-7));
        let mut acc = [f32x4_splat(1.0); 8];
        for _ in 0..iters / 8 {
            for v in &mut acc {
                *v = f32x4_add(f32x4_mul(*v, a), b);
            }
        }
        std::hint::black_box(acc);
        ((iters / 8) * 8 * 4 * 2) as f64
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Ten independent 8-wide FMA chains: enough to cover the FMA latency on two ports.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma_avx2(iters: u64) -> f64 {
        let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
        let b = _mm256_set1_ps(std::hint::black_box(1e-7));
        let mut acc = [_mm256_set1_ps(1.0); 10];
        for _ in 0..iters {
            for v in &mut acc {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
        }
        std::hint::black_box(acc);
        (iters * 10 * 8 * 2) as f64
    }

    /// Ten independent 16-wide FMA chains.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma_avx512(iters: u64) -> f64 {
        let a = _mm512_set1_ps(std::hint::black_box(0.999_999));
        let b = _mm512_set1_ps(std::hint::black_box(1e-7));
        let mut acc = [_mm512_set1_ps(1.0); 10];
        for _ in 0..iters {
            for v in &mut acc {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        std::hint::black_box(acc);
        (iters * 10 * 16 * 2) as f64
    }
}
