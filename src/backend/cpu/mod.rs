//! The cpu backend: rayon threads across rows and blocks, explicit SIMD in the matmul inner
//! loops (AVX-512, AVX2+FMA, NEON, wasm simd128, scalar), chosen at run time.
//!
//! Tensors live in host memory as [`Storage::Host`], the same as the reference backend, so
//! moving a tensor between the two is free. `WEBTENSOR_CPU_SIMD=scalar|avx2|avx512|auto`
//! forces a SIMD path (an unsupported one falls back to the best available, with a warning),
//! so every path can be tested on one machine.

mod act_quant;
mod int_dot;
mod kernels;
mod matmul;
mod parallel;
#[cfg(not(target_arch = "wasm32"))]
mod pool;
mod quant;
mod repack;
mod scan;
pub mod simd;

use std::sync::Arc;

pub use simd::SimdLevel;

use super::{
    host_data, Activations, Backend, BackendInfo, BackendKind, DeviceClass, HostData, HostInputs,
    OpSpec, ScanOp, Storage,
};
use crate::error::Result;
use crate::tensor::DType;

/// The environment variable that forces a SIMD level.
pub const SIMD_ENV: &str = "WEBTENSOR_CPU_SIMD";

/// Multi-threaded SIMD CPU backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    simd: SimdLevel,
    /// Interleaved copies of the `Q4_0`/`Q8_0` weights multiplied so far (shared by clones).
    repacked: Arc<repack::RepackCache>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// The best SIMD level of this CPU, unless `WEBTENSOR_CPU_SIMD` asks for another.
    pub fn new() -> Self {
        let requested = std::env::var(SIMD_ENV).ok();
        let level = match requested.as_deref().map(|v| (v, SimdLevel::parse(v))) {
            None => SimdLevel::detect(),
            Some((_, Some(level))) => level,
            Some((value, None)) => {
                log::warn!("{SIMD_ENV}={value} is not a SIMD level (scalar, avx2, avx512, neon, simd128, auto); detecting");
                SimdLevel::detect()
            }
        };
        Self::with_simd(level)
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
            repacked: Arc::default(),
        }
    }

    /// The SIMD level in use.
    pub fn simd(&self) -> SimdLevel {
        self.simd
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

impl Backend for CpuBackend {
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
            threads: Some(parallel::threads()),
            simd: Some(self.simd.name().to_string()),
            missing_ops: vec![],
            f16_path: "widened to f32 per block".into(),
            reductions: String::new(),
        }
    }

    fn upload(&self, data: HostData) -> Result<Storage> {
        Ok(Storage::Host(Arc::new(data)))
    }

    fn download(&self, storage: &Storage) -> Result<HostData> {
        host_data(BackendKind::Cpu, storage).cloned()
    }

    fn copy(&self, x: &Storage, len: usize) -> Result<Storage> {
        let host = host_data(BackendKind::Cpu, x)?;
        let copied = match host {
            HostData::F32(v) => HostData::F32(parallel_copy(&v[..len])),
            HostData::U32(v) => HostData::U32(parallel_copy(&v[..len])),
            HostData::Bytes(d, b) => HostData::Bytes(*d, parallel_copy(&b[..len * d.unit_bytes()])),
        };
        Ok(Storage::Host(Arc::new(copied)))
    }

    fn write_into(&self, spec: &OpSpec, target: &mut Storage, inputs: &[&Storage]) -> Result<()> {
        super::reference::scatter_rows_host(BackendKind::Cpu, spec, target, inputs)
    }

    fn execute(&self, spec: &OpSpec, inputs: &[&Storage]) -> Result<Storage> {
        let input = HostInputs::new(BackendKind::Cpu, spec, inputs);
        let out = match spec {
            OpSpec::Unary { op, .. } => HostData::F32(kernels::unary(*op, input.f32(0)?)),
            OpSpec::Binary { op, .. } => {
                HostData::F32(kernels::binary(*op, input.f32(0)?, input.f32(1)?))
            }
            OpSpec::RmsNorm { cols, eps, .. } => {
                HostData::F32(kernels::rms_norm(input.f32(0)?, input.f32(1)?, *cols, *eps))
            }
            OpSpec::LayerNorm { cols, eps, .. } => HostData::F32(kernels::layer_norm(
                input.f32(0)?,
                input.f32(1)?,
                input.f32(2)?,
                *cols,
                *eps,
            )),
            OpSpec::Softmax { cols, causal, .. } => {
                HostData::F32(kernels::softmax(input.f32(0)?, *cols, *causal))
            }
            OpSpec::Rope {
                heads,
                head_dim,
                layout,
                ..
            } => HostData::F32(kernels::rope(
                input.f32(0)?,
                input.u32(1)?,
                input.f32(2)?,
                *heads,
                *head_dim,
                *layout,
            )),
            OpSpec::Matmul(m) => {
                HostData::F32(matmul::matmul(self.simd, input.f32(0)?, input.f32(1)?, m))
            }
            OpSpec::Embedding { vocab, dim, .. } => HostData::F32(kernels::embedding(
                input.f32(0)?,
                input.u32(1)?,
                *vocab,
                *dim,
            )),
            OpSpec::Permute { in_shape, perm } => match input.data(0)? {
                HostData::F32(x) => HostData::F32(kernels::permute(x, in_shape, perm)),
                HostData::U32(x) => HostData::U32(kernels::permute(x, in_shape, perm)),
                HostData::Bytes(d, _) => {
                    return Err(crate::Error::backend("cpu", format!("permute of {d}")))
                }
            },
            OpSpec::Argmax { cols, .. } => HostData::U32(kernels::argmax(input.f32(0)?, *cols)),
            OpSpec::Sample { vocab, params, .. } => {
                HostData::U32(params.sample(input.f32(0)?, input.f32(1)?, *vocab))
            }
            OpSpec::ScatterRows { .. } => {
                return Err(crate::Error::backend(
                    "cpu",
                    "scatter_rows runs in place (write_into)",
                ))
            }
            OpSpec::Quantize { format, cols, .. } => {
                HostData::Bytes(*format, quant::quantize(*format, input.f32(0)?, *cols))
            }
            OpSpec::Dequantize { format, cols, .. } => {
                HostData::F32(quant::dequantize(*format, input.bytes(0, *format)?, *cols))
            }
            OpSpec::QMatmul {
                format,
                activations,
                m,
                n,
                k,
            } => {
                let widened;
                let a = match activations {
                    Activations::F16 => {
                        widened = quant::dequantize(DType::F16, input.bytes(0, DType::F16)?, 1);
                        &widened[..]
                    }
                    _ => input.f32(0)?,
                };
                let w = input.bytes(1, *format)?;
                let repacked = match (activations, inputs[1]) {
                    (Activations::Q8_0, Storage::Host(weight)) => {
                        self.repacked.get(self.simd, weight, (*format, w), *n, *k)
                    }
                    _ => None,
                };
                HostData::F32(quant::qmatmul(
                    self.simd,
                    a,
                    (w, repacked.as_deref()),
                    *format,
                    *activations,
                    *m,
                    *n,
                    *k,
                ))
            }
            OpSpec::Concat {
                rows,
                a_cols,
                b_cols,
            } => match (input.data(0)?, input.data(1)?) {
                (HostData::U32(a), HostData::U32(b)) => {
                    HostData::U32(kernels::concat(a, b, *rows, *a_cols, *b_cols))
                }
                _ => HostData::F32(kernels::concat(
                    input.f32(0)?,
                    input.f32(1)?,
                    *rows,
                    *a_cols,
                    *b_cols,
                )),
            },
            OpSpec::Narrow {
                cols, start, len, ..
            } => match input.data(0)? {
                HostData::U32(x) => HostData::U32(kernels::narrow(x, *cols, *start, *len)),
                _ => HostData::F32(kernels::narrow(input.f32(0)?, *cols, *start, *len)),
            },
            OpSpec::Scan {
                op,
                outer,
                len,
                inner,
            } => {
                let view = (*outer, *len, *inner);
                HostData::F32(match op {
                    ScanOp::Linear => {
                        scan::scan(*op, view, input.f32(0)?, input.f32(1)?, input.f32(2)?)
                    }
                    ScanOp::LinearAdjoint => {
                        scan::scan(*op, view, input.f32(0)?, input.f32(1)?, &[])
                    }
                    _ => scan::scan(*op, view, input.f32(0)?, &[], &[]),
                })
            }
            OpSpec::ScanGradA { len, inner, .. } => HostData::F32(kernels::scan_grad_a(
                input.f32(0)?,
                input.f32(1)?,
                input.f32(2)?,
                *len,
                *inner,
            )),
            OpSpec::ScanGradInit { outer, len, inner } => {
                let (a, g) = (input.f32(0)?, input.f32(1)?);
                let at = |c: usize| (c / inner * len) * inner + c % inner;
                HostData::F32((0..outer * inner).map(|c| a[at(c)] * g[at(c)]).collect())
            }
            OpSpec::TernaryDot { format, m, n, k } => {
                let x: &[i8] = bytemuck::cast_slice(input.bytes(1, DType::I8)?);
                let dots =
                    quant::ternary_dot(self.simd, input.bytes(0, *format)?, x, *format, *m, *n, *k);
                HostData::Bytes(DType::I32, bytemuck::cast_slice(&dots).to_vec())
            }
        };
        Ok(Storage::Host(Arc::new(out)))
    }
}

fn parallel_copy<T: Copy + Send + Sync + Default>(src: &[T]) -> Vec<T> {
    let mut out = vec![T::default(); src.len()];
    const CHUNK: usize = 1 << 16;
    parallel::for_each_row(&mut out, CHUNK, 1, |i, dst| {
        dst.copy_from_slice(&src[i * CHUNK..i * CHUNK + dst.len()]);
    });
    out
}
