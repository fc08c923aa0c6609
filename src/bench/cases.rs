//! The benchmark cases: one decode-like and one prefill-like shape per op family.

use super::Size;
use crate::backend::Activations;
use crate::backend::{OpKind, RopeLayout, SampleParams};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// Inputs of a case, as host data plus shape.
#[derive(Clone, Debug)]
pub enum Input {
    /// f32 data.
    F32(Vec<f32>, Vec<usize>),
    /// u32 data.
    U32(Vec<u32>, Vec<usize>),
    /// Packed data (f16, i8, a block format) as raw bytes.
    Packed(DType, Vec<u8>, Vec<usize>),
}

impl Input {
    fn dims(&self) -> &[usize] {
        match self {
            Input::F32(_, s) | Input::U32(_, s) | Input::Packed(_, _, s) => s,
        }
    }

    fn byte_len(&self) -> usize {
        match self {
            Input::F32(d, _) => d.len() * 4,
            Input::U32(d, _) => d.len() * 4,
            Input::Packed(_, d, _) => d.len(),
        }
    }
}

type RunFn = fn(&[Tensor]) -> Result<Tensor>;

/// The sampling parameters the `sample` rows time: a typical chat setting.
const BENCH_SAMPLING: SampleParams = SampleParams {
    temperature: 0.8,
    top_k: 40,
    top_p: 0.9,
};

/// One op at one shape.
pub struct Case {
    /// The op family.
    pub op: OpKind,
    /// `decode`, `prefill`, or a variant name.
    pub label: String,
    /// The inputs.
    pub inputs: Vec<Input>,
    /// Runs the op on device tensors made from `inputs`.
    pub run: RunFn,
    /// Bytes read and written by one op, counting each input and output once.
    pub bytes: u64,
    /// Floating-point operations of one op (0 where not meaningful).
    pub flops: u64,
    /// Elements processed by one op, for ops reported in elements/s (0 otherwise).
    pub elements: u64,
}

impl Case {
    /// Uploads the inputs to `device`.
    pub fn upload(&self, device: &Device) -> Result<Vec<Tensor>> {
        self.inputs
            .iter()
            .map(|i| match i {
                Input::F32(d, s) => Tensor::from_slice(device, d, s.as_slice()),
                Input::U32(d, s) => Tensor::from_slice(device, d, s.as_slice()),
                Input::Packed(t, d, s) => Tensor::from_bytes(device, *t, d.clone(), s.as_slice()),
            })
            .collect()
    }

    /// The output on `device`, read back as f32 (u32 results are converted).
    pub async fn expected(&self, device: &Device) -> Result<Vec<f32>> {
        output_values(&(self.run)(&self.upload(device)?)?).await
    }

    /// The shapes of the inputs, for display.
    pub fn shape(&self) -> String {
        let shapes: Vec<String> = self
            .inputs
            .iter()
            .map(|i| match i {
                Input::Packed(t, _, s) => format!("{s:?} {t}"),
                _ => format!("{:?}", i.dims()),
            })
            .collect();
        shapes.join(" ")
    }
}

/// Reads a tensor as f32 values whatever its dtype (an async readback, so it works in the
/// browser too).
pub async fn output_values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(match t.dtype() {
        crate::DType::F32 => t.to_vec_async::<f32>().await?,
        crate::DType::U32 => {
            let v = t.to_vec_async::<u32>().await?;
            v.into_iter().map(|v| v as f32).collect()
        }
        crate::DType::I32 => {
            let v = t.to_vec_async::<i32>().await?;
            v.into_iter().map(|v| v as f32).collect()
        }
        // Packed data is checked byte for byte.
        _ => {
            let bytes = t.to_bytes_async().await?;
            bytes.into_iter().map(f32::from).collect()
        }
    })
}

/// Deterministic pseudo-random values in [-1, 1) (a small LCG: no dependency, same everywhere).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32_input(shape: &[usize], seed: u64) -> Input {
    Input::F32(values(shape.iter().product(), seed), shape.to_vec())
}

fn case(
    op: OpKind,
    label: &str,
    inputs: Vec<Input>,
    run: RunFn,
    out_elems: usize,
    flops: u64,
) -> Case {
    let in_bytes: usize = inputs.iter().map(Input::byte_len).sum();
    Case {
        op,
        label: label.into(),
        inputs,
        run,
        bytes: (in_bytes + out_elems * 4) as u64,
        flops,
        elements: 0,
    }
}

/// Every case at the given size.
pub fn all(size: Size) -> Vec<Case> {
    // (hidden, ffn, prefill tokens, vocab)
    let (d, ffn, seq, vocab) = match size {
        Size::Small => (1024, 2816, 32, 8192),
        Size::Medium => (4096, 11008, 128, 32000),
    };
    let (heads, head_dim) = (d / 64, 64);
    let mut cases = Vec::new();
    for (label, rows) in [("decode", 1), ("prefill", seq)] {
        let n = rows * d;
        let x = || f32_input(&[rows, d], 1);
        let y = || f32_input(&[rows, d], 2);
        let w = || f32_input(&[d], 3);
        cases.push(case(
            OpKind::Add,
            label,
            vec![x(), y()],
            |t| ops::add(&t[0], &t[1]),
            n,
            0,
        ));
        cases.push(case(
            OpKind::Mul,
            label,
            vec![x(), y()],
            |t| ops::mul(&t[0], &t[1]),
            n,
            0,
        ));
        cases.push(case(
            OpKind::Scale,
            label,
            vec![x()],
            |t| ops::scale(&t[0], 0.5),
            n,
            0,
        ));
        cases.push(case(
            OpKind::Silu,
            label,
            vec![x()],
            |t| ops::silu(&t[0]),
            n,
            0,
        ));
        cases.push(case(
            OpKind::GeluTanh,
            label,
            vec![x()],
            |t| ops::gelu(&t[0]),
            n,
            0,
        ));
        cases.push(case(
            OpKind::GeluErf,
            label,
            vec![x()],
            |t| ops::gelu_erf(&t[0]),
            n,
            0,
        ));
        cases.push(case(
            OpKind::Sigmoid,
            label,
            vec![x()],
            |t| ops::sigmoid(&t[0]),
            n,
            0,
        ));
        cases.push(case(
            OpKind::Softcap,
            label,
            vec![x()],
            |t| ops::softcap(&t[0], 2.0),
            n,
            0,
        ));
        let g = || f32_input(&[rows, ffn], 4);
        let u = || f32_input(&[rows, ffn], 5);
        cases.push(case(
            OpKind::SwiGlu,
            label,
            vec![g(), u()],
            |t| ops::swiglu(&t[0], &t[1]),
            rows * ffn,
            0,
        ));
        cases.push(case(
            OpKind::RmsNorm,
            label,
            vec![x(), w()],
            |t| ops::rms_norm(&t[0], &t[1], 1e-6),
            n,
            0,
        ));
        cases.push(case(
            OpKind::LayerNorm,
            label,
            vec![x(), w(), f32_input(&[d], 6)],
            |t| ops::layer_norm(&t[0], &t[1], &t[2], 1e-5),
            n,
            0,
        ));
        // Attention scores: heads × queries × keys, keys = the prefill length plus a cache.
        let keys = seq * 4;
        let scores = || f32_input(&[heads, rows, keys], 7);
        cases.push(case(
            OpKind::Softmax,
            label,
            vec![scores()],
            |t| ops::softmax_causal(&t[0]),
            heads * rows * keys,
            0,
        ));
        let pos = Input::U32((0..rows as u32).map(|p| p + 17).collect(), vec![rows]);
        cases.push(case(
            OpKind::Rope,
            label,
            vec![
                f32_input(&[rows, heads, head_dim], 8),
                pos,
                Input::F32(ops::rope_inv_freq(10_000.0, head_dim), vec![head_dim / 2]),
            ],
            |t| ops::rope(&t[0], &t[1], &t[2], RopeLayout::HalfSplit),
            n,
            0,
        ));
        // The projection of a feed-forward block: [rows, d] · [ffn, d]ᵀ.
        let flops = 2 * (rows * d * ffn) as u64;
        cases.push(case(
            OpKind::Matmul,
            &format!("{label} a·bᵀ"),
            vec![f32_input(&[rows, d], 9), f32_input(&[ffn, d], 10)],
            |t| ops::matmul_t(&t[0], &t[1]),
            rows * ffn,
            flops,
        ));
        cases.push(case(
            OpKind::Matmul,
            &format!("{label} a·b"),
            vec![f32_input(&[rows, d], 9), f32_input(&[d, ffn], 11)],
            |t| ops::matmul(&t[0], &t[1]),
            rows * ffn,
            flops,
        ));
        let ids = Input::U32(
            (0..rows as u32)
                .map(|i| (i * 7919) % vocab as u32)
                .collect(),
            vec![rows],
        );
        cases.push(case(
            OpKind::Embedding,
            label,
            vec![f32_input(&[vocab, d], 12), ids],
            |t| ops::embedding(&t[0], &t[1]),
            n,
            0,
        ));
        // Gathered rows only: the table is not read whole.
        if let Some(last) = cases.last_mut() {
            last.bytes = (2 * n * 4 + rows * 4) as u64;
        }
        cases.push(case(
            OpKind::Permute,
            label,
            vec![f32_input(&[rows, heads, head_dim], 13)],
            |t| ops::transpose(&t[0], 0, 1),
            n,
            0,
        ));
        cases.push(case(
            OpKind::Argmax,
            label,
            vec![f32_input(&[rows, vocab], 14)],
            |t| ops::argmax(&t[0]),
            rows,
            0,
        ));
        // Logits scaled like a model's (a spread of a few units), a number in [0, 1) per row.
        let logits = Input::F32(
            values(rows * vocab, 15).iter().map(|v| 4.0 * v).collect(),
            vec![rows, vocab],
        );
        let numbers = Input::F32(
            values(rows, 16).iter().map(|v| 0.5 + 0.45 * v).collect(),
            vec![rows],
        );
        cases.push(case(
            OpKind::Sample,
            label,
            vec![logits, numbers],
            |t| ops::sample(&t[0], &t[1], BENCH_SAMPLING),
            rows,
            0,
        ));
        quant_cases(&mut cases, label, rows, d, ffn);
        scan_cases(&mut cases, label, rows, d);
    }
    cases
}

/// Scans over a state-space layer's channels: decode continues `d` channels by the tokens of
/// one step (here 1 or the prefill length); a long case scans 65,536 steps of 64 channels.
fn scan_cases(cases: &mut Vec<Case>, label: &str, rows: usize, d: usize) {
    let mut shapes = vec![(format!("{label} {rows}×{d}"), vec![rows, d])];
    if rows > 1 {
        shapes.push(("long 65536×64".into(), vec![65_536, 64]));
    }
    for (name, shape) in shapes {
        let n: usize = shape.iter().product();
        let decay = Input::F32(
            values(n, 30).iter().map(|v| 0.75 + 0.2 * v).collect(),
            shape.clone(),
        );
        let h0 = f32_input(&shape[1..], 32);
        let before = cases.len();
        cases.push(case(
            OpKind::LinearScan,
            &name,
            vec![decay.clone(), f32_input(&shape, 31), h0.clone()],
            |t| ops::linear_scan(&t[0], &t[1], &t[2], 0),
            n,
            0,
        ));
        cases.push(case(
            OpKind::LogCumprod,
            &name,
            vec![decay.clone()],
            |t| ops::log_cumprod(&t[0], 0),
            n,
            0,
        ));
        cases.push(case(
            OpKind::LogCumSumExp,
            &name,
            vec![f32_input(&shape, 33)],
            |t| ops::logcumsumexp(&t[0], 0),
            n,
            0,
        ));
        cases.push(case(
            OpKind::ScanBackward,
            &name,
            vec![decay, h0, f32_input(&shape, 34), f32_input(&shape, 35)],
            |t| ops::linear_scan_backward(&t[0], &t[1], &t[2], &t[3], 0).map(|(ga, _, _)| ga),
            2 * n,
            0,
        ));
        for c in &mut cases[before..] {
            c.elements = n as u64;
        }
    }
}

/// `t[0] · t[1]ᵀ` with f32 activations.
fn f32_product(t: &[Tensor]) -> Result<Tensor> {
    ops::qmatmul_t(&t[0], &t[1], Activations::F32)
}

/// `t[0] · t[1]ᵀ` with `Q8_0` activations.
fn q8_0_product(t: &[Tensor]) -> Result<Tensor> {
    ops::qmatmul_t(&t[0], &t[1], Activations::Q8_0)
}

/// `t[0] · t[1]ᵀ` with int8 activations, one scale per row.
fn i8_product(t: &[Tensor]) -> Result<Tensor> {
    ops::qmatmul_t(&t[0], &t[1], Activations::I8)
}

/// `t[0] · t[1]ᵀ` with `Q8_K` activations.
fn q8_k_product(t: &[Tensor]) -> Result<Tensor> {
    ops::qmatmul_t(&t[0], &t[1], Activations::Q8_K)
}

/// `w` `[n, k]` quantized on the host; for a format webtensor cannot quantize (llama.cpp's
/// K-quants, `IQ4_NL`, `IQ4_XS`), blocks of random bytes with small f16 scales (any bytes are
/// valid quants), which cost a product what real weights cost.
fn packed_input(format: DType, n: usize, k: usize, seed: u64) -> Input {
    let mut bytes = vec![0u8; format.storage_len(n * k, k).unwrap_or(0) * format.unit_bytes()];
    match crate::quant::format(format) {
        Some(f) if f.quantize.is_none() => {
            let noise = values(bytes.len(), seed);
            for (b, v) in bytes.iter_mut().zip(noise) {
                *b = ((v + 1.0) * 127.5) as u8;
            }
            let scale = crate::quant::f16_bits(0.01).to_le_bytes();
            for block in bytes.chunks_exact_mut(format.block_bytes()) {
                for &at in f.f16_scales {
                    block[at..at + 2].copy_from_slice(&scale);
                }
            }
        }
        _ => crate::quant::quantize(format, &values(n * k, seed), &mut bytes),
    }
    Input::Packed(format, bytes, vec![n, k])
}

/// Quantized products (`[rows, d] · [ffn, d]ᵀ`, the weight packed), their bytes dominated by
/// the weight; decode adds every format, prefill the common ones; plus quantize/dequantize of
/// the weight and the exact ternary dot.
fn quant_cases(cases: &mut Vec<Case>, label: &str, rows: usize, d: usize, ffn: usize) {
    type Variant = (DType, &'static str, RunFn);
    let decode: &[Variant] = &[
        (DType::F16, "f32 acts", f32_product),
        (DType::Q8_0, "f32 acts", f32_product),
        (DType::Q8_0, "q8_0 acts", q8_0_product),
        (DType::Q4_0, "f32 acts", f32_product),
        (DType::Q4_0, "q8_0 acts", q8_0_product),
        (DType::TQ1_0, "i8 acts", i8_product),
        (DType::TQ2_0, "f32 acts", f32_product),
        (DType::TQ2_0, "i8 acts", i8_product),
        (DType::TernaryPlanes, "i8 acts", i8_product),
        // llama.cpp's formats: the super-blocks with f32 activations and with Q8_K ones (what
        // every backend's integer mode and llama.cpp run; wgpu rounds them in a dispatch of
        // their own), the legacy blocks with Q8_0 ones (the cpu backend's; none on wgpu, a row
        // that says so) and f32 ones (wgpu's).
        (DType::Q4_K, "f32 acts", f32_product),
        (DType::Q4_K, "q8_k acts", q8_k_product),
        (DType::Q5_K, "f32 acts", f32_product),
        (DType::Q5_K, "q8_k acts", q8_k_product),
        (DType::Q6_K, "f32 acts", f32_product),
        (DType::Q6_K, "q8_k acts", q8_k_product),
        (DType::Q3_K, "f32 acts", f32_product),
        (DType::Q3_K, "q8_k acts", q8_k_product),
        (DType::Q2_K, "f32 acts", f32_product),
        (DType::Q2_K, "q8_k acts", q8_k_product),
        (DType::IQ4_XS, "f32 acts", f32_product),
        (DType::IQ4_XS, "q8_k acts", q8_k_product),
        (DType::Q4_1, "q8_0 acts", q8_0_product),
        (DType::Q5_0, "q8_0 acts", q8_0_product),
        (DType::Q5_1, "q8_0 acts", q8_0_product),
        (DType::IQ4_NL, "q8_0 acts", q8_0_product),
        (DType::Q4_1, "f32 acts", f32_product),
        (DType::Q5_0, "f32 acts", f32_product),
        (DType::Q5_1, "f32 acts", f32_product),
        (DType::IQ4_NL, "f32 acts", f32_product),
    ];
    // Prefill: Q8_0 with f32 activations, Q4_0 and TQ2_0 with integer ones, Q4_K (the
    // Q4_K_M files) with f32 ones and Q8_K ones (the engine's choice on every backend), and Q6_K
    // (those files' other format) with Q8_K ones.
    let variants: Vec<&Variant> = if rows == 1 {
        decode.iter().collect()
    } else {
        [1, 4, 7, 9, 10, 14].iter().map(|&i| &decode[i]).collect()
    };
    let flops = 2 * (rows * d * ffn) as u64;
    for &&(format, acts, run) in &variants {
        cases.push(case(
            OpKind::QMatmul,
            &format!("{label} {format} {acts}"),
            vec![f32_input(&[rows, d], 20), packed_input(format, ffn, d, 21)],
            run,
            rows * ffn,
            flops,
        ));
    }
    if rows > 1 {
        return;
    }
    for format in [DType::Q8_0, DType::TQ2_0] {
        let values = values(ffn * d, 22);
        cases.push(case(
            OpKind::Quantize,
            &format!("{format}"),
            vec![Input::F32(values, vec![ffn, d])],
            if format == DType::Q8_0 {
                |t| ops::quantize(&t[0], DType::Q8_0)
            } else {
                |t| ops::quantize(&t[0], DType::TQ2_0)
            },
            0,
            0,
        ));
        let packed = packed_input(format, ffn, d, 22);
        let packed_bytes = packed.byte_len();
        if let Some(last) = cases.last_mut() {
            last.bytes += packed_bytes as u64;
        }
        cases.push(case(
            OpKind::Dequantize,
            &format!("{format}"),
            vec![packed],
            |t| ops::dequantize(&t[0]),
            ffn * d,
            0,
        ));
    }
    let x: Vec<u8> = values(8 * d, 23)
        .iter()
        .map(|v| (v * 127.0) as i8 as u8)
        .collect();
    for format in [DType::TQ2_0, DType::TernaryPlanes] {
        cases.push(case(
            OpKind::TernaryDot,
            &format!("{format} 8 rows"),
            vec![
                packed_input(format, ffn, d, 24),
                Input::Packed(DType::I8, x.clone(), vec![8, d]),
            ],
            |t| ops::ternary_dot(&t[0], &t[1]),
            8 * ffn,
            0,
        ));
    }
}
