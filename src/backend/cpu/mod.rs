//! The cpu backend: rayon threads across rows and blocks, explicit SIMD in the matmul inner
//! loops (AVX-512, AVX2+FMA, NEON, wasm simd128, scalar), chosen at run time.
//!
//! Tensors live in host memory as [`Storage::Host`], the same as the reference backend, so
//! moving a tensor between the two is free. The option `cpu.simd` ([`CpuOptions`]) forces a
//! SIMD path (an unsupported one falls back to the best available, with a warning), so every
//! path can be tested on one machine.

mod act_quant;
mod fused;
mod gemm;
mod int_dot;
mod kernels;
mod kquant_dot;
mod matmul;
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
mod pool;
mod quant;
mod repack;
mod scan;
pub mod simd;
mod threads;

use std::sync::Arc;

pub use simd::SimdLevel;

use super::host::{HostKernels, Plain, ScanView, Weight};
use super::options::CpuOptions;
use super::{
    Activations, AttentionSpec, BackendInfo, BackendKind, BinaryOp, DeviceClass, HostData,
    LinearSpec, MatmulSpec, RopeLayout, ScanOp, Storage, UnaryOp,
};
use crate::dtype::DType;

/// Multi-threaded SIMD CPU backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    simd: SimdLevel,
    /// The options it was started with (`info` shows them).
    options: CpuOptions,
    /// Interleaved copies of the `Q4_0`/`Q8_0` weights multiplied so far (shared by clones).
    repacked: Arc<repack::RepackCache>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// The best SIMD level of this CPU.
    pub fn new() -> Self {
        Self::with_options(&CpuOptions::default())
    }

    /// A backend with `options`: the SIMD level they ask for (see [`CpuBackend::with_simd`]),
    /// else the best one.
    pub fn with_options(options: &CpuOptions) -> Self {
        CpuBackend {
            options: options.clone(),
            ..Self::with_simd(options.simd.unwrap_or_else(SimdLevel::detect))
        }
    }

    /// A backend on the given SIMD level, or the best available one if this CPU lacks it.
    pub fn with_simd(level: SimdLevel) -> Self {
        let simd = if level.is_supported() {
            level
        } else {
            let best = SimdLevel::detect();
            log::warn!("this CPU cannot run {level}; the cpu backend uses {best}");
            best
        };
        CpuBackend {
            simd,
            options: CpuOptions { simd: Some(level) },
            repacked: Arc::default(),
        }
    }

    /// The SIMD level in use.
    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    /// Whether `Q4_0`/`Q8_0` products with `Q8_0` activations run on interleaved copies of
    /// the weights (which then replace the weights' mapped pages in memory).
    pub fn repacks_weights(&self) -> bool {
        repack::supported(self.simd)
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| {
                    l.starts_with("model name")
                        || l.starts_with("Model")
                        || l.starts_with("Hardware")
                })
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

impl HostKernels for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Cpu,
            class: DeviceClass::Cpu,
            device_name: cpu_model(),
            vendor: String::new(),
            driver: String::new(),
            api: format!("native {}", std::env::consts::ARCH),
            features: simd::detected_features(),
            limits: vec![],
            threads: Some(threads::threads()),
            simd: Some(self.simd.name().to_string()),
            missing_ops: vec![],
            f16_path: "widened to f32 per block".into(),
            reductions: String::new(),
            prefill: String::new(),
            profiler: String::new(),
            options: self.options.pairs(),
            variants: vec![],
        }
    }

    fn copy(&self, x: &HostData, len: usize) -> HostData {
        match x {
            HostData::F32(v) => HostData::F32(parallel_copy(&v[..len])),
            HostData::U32(v) => HostData::U32(parallel_copy(&v[..len])),
            HostData::Bytes(d, b) => {
                HostData::Bytes(*d, parallel_copy(&b[..len * d.unit_bytes()]).into())
            }
        }
    }

    fn unary(&self, op: UnaryOp, x: &[f32]) -> Vec<f32> {
        kernels::unary(op, x)
    }

    fn binary(&self, op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
        kernels::binary(op, a, b)
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], cols: usize, eps: f32) -> Vec<f32> {
        kernels::rms_norm(x, w, cols, eps)
    }

    fn layer_norm(&self, x: &[f32], w: &[f32], b: &[f32], cols: usize, eps: f32) -> Vec<f32> {
        kernels::layer_norm(x, w, b, cols, eps)
    }

    fn softmax(&self, x: &[f32], cols: usize, causal: Option<usize>) -> Vec<f32> {
        kernels::softmax(x, cols, causal)
    }

    fn rope(
        &self,
        x: &[f32],
        positions: &[u32],
        inv_freq: &[f32],
        heads: usize,
        head_dim: usize,
        layout: RopeLayout,
    ) -> Vec<f32> {
        kernels::rope(x, positions, inv_freq, heads, head_dim, layout)
    }

    fn matmul(&self, a: &[f32], b: &[f32], m: &MatmulSpec) -> Vec<f32> {
        matmul::matmul(self.simd, a, b, m)
    }

    fn embedding(&self, table: &[f32], ids: &[u32], vocab: usize, dim: usize) -> Vec<f32> {
        kernels::embedding(table, ids, vocab, dim)
    }

    fn permute<T: Plain>(&self, x: &[T], in_shape: &[usize], perm: &[usize]) -> Vec<T> {
        kernels::permute(x, in_shape, perm)
    }

    fn argmax(&self, x: &[f32], cols: usize) -> Vec<u32> {
        kernels::argmax(x, cols)
    }

    fn quantize(&self, format: DType, x: &[f32], cols: usize) -> Vec<u8> {
        quant::quantize(format, x, cols)
    }

    fn dequantize(&self, format: DType, bytes: &[u8], cols: usize) -> Vec<f32> {
        quant::dequantize(format, bytes, cols)
    }

    fn qmatmul(
        &self,
        a: &[f32],
        w: &[u8],
        weight: &Storage,
        format: DType,
        act: Activations,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<f32> {
        let prepared = quant::prepare(self.simd, a, act, k);
        self.packed_product(&prepared, (w, weight), format, act, (m, n, k))
    }

    fn swiglu_linear(
        &self,
        a: &[f32],
        gate: Weight<'_>,
        up: Weight<'_>,
        l: &LinearSpec,
    ) -> Vec<f32> {
        self.swiglu_linear_kernel(a, (gate, up), l)
    }

    fn linear_residual(
        &self,
        a: &[f32],
        w: Weight<'_>,
        residual: &[f32],
        l: &LinearSpec,
    ) -> Vec<f32> {
        self.linear_residual_kernel(a, w, residual, l)
    }

    fn paged_attention(
        &self,
        q: &[f32],
        pools: (&[f32], &[f32]),
        rows: &[u32],
        spec: &AttentionSpec,
    ) -> Vec<f32> {
        fused::paged_attention(self.simd, q, pools, rows, spec)
    }

    fn concat<T: Plain>(
        &self,
        a: &[T],
        b: &[T],
        rows: usize,
        a_cols: usize,
        b_cols: usize,
    ) -> Vec<T> {
        kernels::concat(a, b, rows, a_cols, b_cols)
    }

    fn narrow<T: Plain>(
        &self,
        x: &[T],
        _rows: usize,
        cols: usize,
        start: usize,
        len: usize,
    ) -> Vec<T> {
        kernels::narrow(x, cols, start, len)
    }

    fn scan(&self, op: ScanOp, view: ScanView, x: &[f32], y: &[f32], h0: &[f32]) -> Vec<f32> {
        scan::scan(op, view, x, y, h0)
    }

    fn scan_grad_a(&self, (_, len, inner): ScanView, g: &[f32], h: &[f32], h0: &[f32]) -> Vec<f32> {
        kernels::scan_grad_a(g, h, h0, len, inner)
    }

    fn scan_grad_init(&self, (outer, len, inner): ScanView, a: &[f32], g: &[f32]) -> Vec<f32> {
        let at = |c: usize| (c / inner * len) * inner + c % inner;
        (0..outer * inner).map(|c| a[at(c)] * g[at(c)]).collect()
    }

    fn ternary_dot(
        &self,
        w: &[u8],
        x: &[i8],
        format: DType,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<i32> {
        quant::ternary_dot(self.simd, w, x, format, m, n, k)
    }
}

fn parallel_copy<T: Copy + Send + Sync + Default>(src: &[T]) -> Vec<T> {
    let mut out = vec![T::default(); src.len()];
    const CHUNK: usize = 1 << 16;
    threads::for_each_row(&mut out, CHUNK, 1, |i, dst| {
        dst.copy_from_slice(&src[i * CHUNK..i * CHUNK + dst.len()]);
    });
    out
}
