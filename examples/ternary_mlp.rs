//! A small ternary (BitNet b1.58 style) MLP: 512 → 256 → 10 on a batch of 32, forward only,
//! timed on every backend present and checked against the reference.
//!
//! Weights are ternary with one scale per 256 values; activations are rounded to int8 per row
//! (`Activations::I8`) so the products are integer dot products.
//!
//! ```text
//! cargo run --release --example ternary_mlp            # TQ2_0 weights
//! cargo run --release --example ternary_mlp -- tq1_0   # or tq1_0, ternary_planes
//! ```

use std::time::Instant;

use webtensor::ops::{self, Activations};
use webtensor::{DType, Device, Tensor};

const BATCH: usize = 32;
const INPUT: usize = 512;
const HIDDEN: usize = 256;
const OUTPUT: usize = 10;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

struct Mlp {
    w1: Tensor,
    w2: Tensor,
}

impl Mlp {
    fn new(device: &Device, format: DType) -> webtensor::Result<Mlp> {
        let ternary = |rows, cols, seed| {
            let w = Tensor::from_vec(device, values(rows * cols, seed), [rows, cols])?;
            ops::quantize(&w, format)
        };
        Ok(Mlp {
            w1: ternary(HIDDEN, INPUT, 1)?,
            w2: ternary(OUTPUT, HIDDEN, 2)?,
        })
    }

    fn forward(&self, x: &Tensor) -> webtensor::Result<Tensor> {
        let h = ops::silu(&ops::qmatmul_t(x, &self.w1, Activations::I8)?)?;
        ops::qmatmul_t(&h, &self.w2, Activations::I8)
    }
}

fn run(device: &Device, format: DType, x: &[f32]) -> webtensor::Result<(Vec<f32>, f64)> {
    let mlp = Mlp::new(device, format)?;
    let input = Tensor::from_slice(device, x, [BATCH, INPUT])?;
    let logits = mlp.forward(&input)?.to_vec::<f32>()?;
    // Time enough forwards for at least 0.2 s.
    let mut iterations = 0u32;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < 0.2 || iterations < 3 {
        mlp.forward(&input)?;
        device.synchronize()?;
        iterations += 1;
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / iterations as f64;
    Ok((logits, ms))
}

fn invalid(reason: String) -> webtensor::Error {
    webtensor::Error::InvalidArgument {
        op: "ternary_mlp",
        reason,
    }
}

fn main() -> webtensor::Result<()> {
    let format = match std::env::args().nth(1) {
        Some(name) => DType::parse(&name)
            .filter(|d| d.is_ternary())
            .ok_or_else(|| invalid(format!("`{name}` is not tq1_0, tq2_0 or ternary_planes")))?,
        None => DType::TQ2_0,
    };
    let x = values(BATCH * INPUT, 3);
    let (want, _) = run(&Device::reference(), format, &x)?;
    println!(
        "ternary MLP {INPUT}→{HIDDEN}→{OUTPUT}, batch {BATCH}, {format} weights ({:.4} bits/weight), int8 activations",
        format.bits_per_value()
    );
    println!(
        "{:<10} {:>12} {:>16}",
        "backend", "ms/forward", "max |Δ| vs ref"
    );
    for name in ["wgpu", "cpu", "reference"] {
        let device = match Device::new(name) {
            Ok(d) => d,
            Err(e) => {
                println!("{name:<10} absent: {e}");
                continue;
            }
        };
        let (got, ms) = run(&device, format, &x)?;
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("{name:<10} {ms:>12.3} {worst:>16.2e}");
        if worst > 1e-3 {
            return Err(invalid(format!(
                "{name} differs from the reference by {worst}"
            )));
        }
    }
    Ok(())
}
