//! The conformance matrix: every op on every present backend against the `reference` oracle,
//! on seeded random inputs over awkward shapes (1, 3, 255, 257, 4097, non-multiples of the
//! workgroup sizes, empty), plus NaN/inf propagation.
//!
//! Each op is a function taking the device under test; the `matrix!` macro turns it into one
//! test per backend (`cpu::matmul`, `wgpu::matmul`, ...), so `cargo test --test conformance
//! wgpu::` runs one backend. A missing wgpu adapter fails in CI and is skipped elsewhere; the
//! `cuda::` rows run wherever a CUDA device is present and print why they skipped otherwise
//! (`WEBTENSOR_REQUIRE_CUDA=1` turns the skip into a failure on a GPU machine).
//!
//! The kernel variants chosen by [`BackendOptions`] run here too, each on a device of its own
//! started with those options, which first asserts that the options took effect (the
//! backend's `info().variants`, or its SIMD level): the cpu rows once per forced SIMD path
//! (`cpu_scalar::`, `cpu_avx2::`, `cpu_avx512::`; a path this CPU lacks prints why it skips),
//! and the wgpu products, norms and attention with each portable fallback and with the
//! row-team (GPU) shape forced (`wgpu_f16_off::`, `wgpu_int_dot_off::`, `wgpu_texels_off::`,
//! `wgpu_row_teams::`, `wgpu_row_teams_workgroup::`, `wgpu_row_teams_untiled::`).

mod common;
#[path = "conformance/formats.rs"]
mod formats;
#[path = "conformance/fused.rs"]
mod fused;

use common::{assert_close, reference, rng, tensor, uniform};
use formats::{
    bf16_products, kquant_products, legacy_products, llama_cpp_formats_gguf_fixtures,
    llama_cpp_formats_qmatmul,
};
use fused::{
    linear_residual, norm_linear, norm_linear_into, norm_linear_rope, norm_linears_into,
    norm_swiglu_linear, paged_attention, shared_rounding, swiglu_linear,
};
use webtensor::backend::cpu::SimdLevel;
use webtensor::backend::{BackendOptions, Switch};
use webtensor::ops::{self, Activations, RopeLayout, SampleParams};
use webtensor::{DType, Device, Tensor};

/// Tolerance of elementwise ops, norms, softmax and rope (docs/DESIGN.md, Tolerances).
const TOL: f64 = 1e-5;

type UnaryFn = fn(&Tensor) -> webtensor::Result<Tensor>;
type BinaryFn = fn(&Tensor, &Tensor) -> webtensor::Result<Tensor>;

/// The same computation on the device under test and on the reference, compared.
fn compare(what: &str, dev: &Device, tol: f64, f: impl Fn(&Device) -> Tensor) {
    let got: Vec<f32> = f(dev).to_vec().unwrap_or_else(|e| panic!("{what}: {e}"));
    let want: Vec<f32> = f(&reference())
        .to_vec()
        .unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    assert_close(
        &format!("{what} on {}", dev.backend_name()),
        &got,
        &want,
        tol,
    );
}

const LENGTHS: [usize; 8] = [0, 1, 3, 64, 255, 257, 4097, 70_001];
const ROWS_COLS: [(usize, usize); 10] = [
    (1, 1),
    (3, 5),
    (2, 255),
    (4, 257),
    (3, 4097),
    (1, 10_000),
    // Past what one lane walking the row may loop on lavapipe (kernels.rs, "Loop budget").
    (2, 40_000),
    (300, 3),
    (0, 8),
    (2, 1),
];

fn unary(dev: &Device) {
    let mut r = rng(1);
    for len in LENGTHS {
        let x = uniform(&mut r, len, 8.0);
        let cases: [(&str, UnaryFn); 7] = [
            ("silu", ops::silu),
            ("gelu", ops::gelu),
            ("gelu_erf", ops::gelu_erf),
            ("sigmoid", ops::sigmoid),
            ("scale", |t| ops::scale(t, -0.37)),
            ("softcap", |t| ops::softcap(t, 2.5)),
            ("softcap negative cap", |t| ops::softcap(t, -0.7)),
        ];
        for (name, f) in cases {
            compare(&format!("{name} len {len}"), dev, TOL, |d| {
                f(&tensor(d, &x, &[len])).unwrap()
            });
        }
    }
    // Large magnitudes must not overflow intermediate exp/tanh into NaN.
    let big: Vec<f32> = vec![-200.0, -90.0, -30.0, 30.0, 90.0, 200.0];
    let softcap: UnaryFn = |t| ops::softcap(t, 0.5);
    for f in [
        ops::silu as UnaryFn,
        ops::gelu,
        ops::gelu_erf,
        ops::sigmoid,
        softcap,
    ] {
        compare("unary big", dev, TOL, |d| {
            f(&tensor(d, &big, &[6])).unwrap()
        });
    }
}

fn binary(dev: &Device) {
    let mut r = rng(2);
    for len in LENGTHS {
        let a = uniform(&mut r, len, 4.0);
        let b = uniform(&mut r, len, 4.0);
        for (name, f) in [
            ("add", ops::add as BinaryFn),
            ("mul", ops::mul),
            ("swiglu", ops::swiglu),
        ] {
            compare(&format!("{name} len {len}"), dev, TOL, |d| {
                f(&tensor(d, &a, &[len]), &tensor(d, &b, &[len])).unwrap()
            });
        }
    }
    // Broadcasting a trailing-axes operand (a bias over rows).
    for (rows, cols) in [(5, 3), (7, 257), (2, 4097)] {
        let a = uniform(&mut r, rows * cols, 2.0);
        let b = uniform(&mut r, cols, 2.0);
        compare(&format!("add broadcast {rows}x{cols}"), dev, TOL, |d| {
            ops::add(&tensor(d, &a, &[rows, cols]), &tensor(d, &b, &[cols])).unwrap()
        });
    }
}

fn rms_norm(dev: &Device) {
    let mut r = rng(3);
    for (rows, cols) in ROWS_COLS {
        let x = uniform(&mut r, rows * cols, 3.0);
        let w = uniform(&mut r, cols, 2.0);
        compare(&format!("rms_norm {rows}x{cols}"), dev, TOL, |d| {
            ops::rms_norm(&tensor(d, &x, &[rows, cols]), &tensor(d, &w, &[cols]), 1e-6).unwrap()
        });
    }
}

fn layer_norm(dev: &Device) {
    let mut r = rng(4);
    for (rows, cols) in ROWS_COLS {
        // An offset makes the mean large relative to the spread, as in real activations.
        let x: Vec<f32> = uniform(&mut r, rows * cols, 3.0)
            .iter()
            .map(|v| v + 5.0)
            .collect();
        let w = uniform(&mut r, cols, 2.0);
        let b = uniform(&mut r, cols, 1.0);
        compare(&format!("layer_norm {rows}x{cols}"), dev, TOL, |d| {
            let t = |v: &[f32], s: &[usize]| tensor(d, v, s);
            ops::layer_norm(
                &t(&x, &[rows, cols]),
                &t(&w, &[cols]),
                &t(&b, &[cols]),
                1e-5,
            )
            .unwrap()
        });
    }
}

fn softmax(dev: &Device) {
    let mut r = rng(5);
    for (rows, cols) in ROWS_COLS {
        // Scores up to ±60: exp overflows f32 unless the row max is subtracted.
        let x = uniform(&mut r, rows * cols, 60.0);
        compare(&format!("softmax {rows}x{cols}"), dev, TOL, |d| {
            ops::softmax(&tensor(d, &x, &[rows, cols])).unwrap()
        });
    }
    for (heads, q, k) in [
        (1, 1, 1),
        (2, 3, 3),
        (3, 5, 9),
        (2, 1, 300),
        (1, 17, 257),
        (4, 64, 64),
    ] {
        let x = uniform(&mut r, heads * q * k, 10.0);
        compare(&format!("softmax_causal {heads}x{q}x{k}"), dev, TOL, |d| {
            ops::softmax_causal(&tensor(d, &x, &[heads, q, k])).unwrap()
        });
    }
}

fn rope(dev: &Device) {
    let mut r = rng(6);
    for (rows, heads, head_dim) in [
        (1, 1, 2),
        (3, 2, 8),
        (7, 4, 64),
        (5, 3, 128),
        (257, 1, 6),
        (2, 8, 80),
    ] {
        let x = uniform(&mut r, rows * heads * head_dim, 2.0);
        let mut pos: Vec<u32> = (0..rows).map(|_| r.random_range(0..4096)).collect();
        pos[0] = if rows > 1 { 0 } else { 100_000 };
        // Unscaled tables, and one scaled like Llama 3.1's (low frequencies divided by 8).
        let mut scaled = ops::rope_inv_freq(500_000.0, head_dim);
        let half = scaled.len();
        scaled[half / 2..].iter_mut().for_each(|f| *f /= 8.0);
        let tables = [
            ("θ=1e4", ops::rope_inv_freq(10_000.0, head_dim)),
            ("θ=5e5", ops::rope_inv_freq(500_000.0, head_dim)),
            ("scaled", scaled),
        ];
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            for (name, table) in &tables {
                compare(
                    &format!("rope {rows}x{heads}x{head_dim} {layout:?} {name}"),
                    dev,
                    TOL,
                    |d| {
                        let xt = tensor(d, &x, &[rows, heads, head_dim]);
                        let freqs = tensor(d, table, &[half]);
                        ops::rope(&xt, &tensor(d, &pos, &[rows]), &freqs, layout).unwrap()
                    },
                );
            }
        }
    }
}

use rand::Rng;

fn matmul(dev: &Device) {
    let mut r = rng(7);
    // (batch, m, n, k)
    let shapes = [
        (1, 1, 1, 1),
        (1, 1, 3, 5),
        (1, 1, 257, 255),
        (1, 1, 64, 4097),
        (1, 2, 1000, 64),
        (1, 3, 5, 7),
        (2, 17, 33, 65),
        (1, 64, 64, 64),
        (3, 1, 255, 257),
        (1, 130, 96, 129),
        (3, 4, 19, 1028),
        (2, 4, 7, 0),
        (1, 0, 5, 3),
        // The packed GEMM's edges: rows not a multiple of any micro-kernel's (4, 6, 12),
        // columns past one 256-wide task block with a short panel (panels are 16 or 32
        // wide), depth past two 256-deep slices with a short last one not a multiple of the
        // 16-deep transposes; then exact multiples of all of them; then a last block of 16
        // columns, short of a 32-wide panel, one 16-deep transpose deep.
        (1, 13, 300, 600),
        (2, 25, 33, 257),
        (1, 24, 512, 512),
        (1, 12, 48, 16),
        // Decode's a·b splits each output row into 1024-column slices; the last one short.
        (2, 3, 2500, 40),
        // Decode's a·b adds four rows of `b` at a time (a depth not a multiple of four leaves
        // single rows), splits a deep product into depth slices whose partial sums are added
        // (the last slice short), and leaves vector tails at 7 rows and 258 columns.
        (1, 1, 1030, 37),
        (1, 5, 131, 11001),
        (2, 7, 258, 23),
    ];
    for (batch, m, n, k) in shapes {
        let a = uniform(&mut r, batch * m * k, 1.0);
        let b_shared = uniform(&mut r, n * k, 1.0);
        let b_batched = uniform(&mut r, batch * n * k, 1.0);
        let tol = TOL * (k.max(1) as f64).sqrt();
        for transposed in [true, false] {
            let f = if transposed {
                ops::matmul_t
            } else {
                ops::matmul
            };
            let rhs_dims = |lead: Option<usize>| {
                let mut d: Vec<usize> = lead.into_iter().collect();
                d.extend(if transposed { [n, k] } else { [k, n] });
                d
            };
            let what = format!(
                "{} b{batch} m{m} n{n} k{k}",
                if transposed { "a·bᵀ" } else { "a·b" }
            );
            compare(&format!("{what} shared rhs"), dev, tol, |d| {
                f(
                    &tensor(d, &a, &[batch, m, k]),
                    &tensor(d, &b_shared, &rhs_dims(None)),
                )
                .unwrap()
            });
            compare(&format!("{what} batched rhs"), dev, tol, |d| {
                f(
                    &tensor(d, &a, &[batch, m, k]),
                    &tensor(d, &b_batched, &rhs_dims(Some(batch))),
                )
                .unwrap()
            });
        }
    }
}

fn embedding(dev: &Device) {
    let mut r = rng(8);
    for (vocab, dim, count) in [
        (1, 1, 1),
        (10, 3, 7),
        (1000, 257, 33),
        (50, 4097, 3),
        (7, 5, 0),
    ] {
        let table = uniform(&mut r, vocab * dim, 1.0);
        let ids: Vec<u32> = (0..count)
            .map(|_| r.random_range(0..vocab as u32))
            .collect();
        compare(
            &format!("embedding {vocab}x{dim}, {count} ids"),
            dev,
            0.0,
            |d| {
                ops::embedding(
                    &tensor(d, &table, &[vocab, dim]),
                    &tensor(d, &ids, &[count]),
                )
                .unwrap()
            },
        );
    }
}

fn permute(dev: &Device) {
    let mut r = rng(9);
    let cases: [(&[usize], &[usize]); 8] = [
        (&[1], &[0]),
        (&[3, 5], &[1, 0]),
        (&[257, 255], &[1, 0]),
        (&[2, 3, 4], &[2, 0, 1]),
        (&[4, 7, 2, 3], &[0, 2, 1, 3]),
        (&[2, 3, 1, 4, 5], &[4, 3, 2, 1, 0]),
        (&[2, 2, 3, 1, 2, 3], &[5, 1, 3, 0, 4, 2]),
        (&[0, 4], &[1, 0]),
    ];
    for (shape, perm) in cases {
        let n: usize = shape.iter().product();
        let x = uniform(&mut r, n, 1.0);
        compare(&format!("permute {shape:?} by {perm:?}"), dev, 0.0, |d| {
            ops::permute(&tensor(d, &x, shape), perm).unwrap()
        });
        // u32 data moves bit for bit too.
        let ids: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let got: Vec<u32> = ops::permute(&tensor(dev, &ids, shape), perm)
            .unwrap()
            .to_vec()
            .unwrap();
        let want: Vec<u32> = ops::permute(&tensor(&reference(), &ids, shape), perm)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(
            got,
            want,
            "u32 permute {shape:?} by {perm:?} on {}",
            dev.backend_name()
        );
    }
    let x = uniform(&mut r, 6 * 5 * 4, 1.0);
    compare("transpose", dev, 0.0, |d| {
        ops::transpose(&tensor(d, &x, &[6, 5, 4]), 0, 2).unwrap()
    });
}

fn argmax(dev: &Device) {
    let mut r = rng(10);
    for (rows, cols) in [
        (1, 1),
        (3, 5),
        (2, 255),
        (4, 257),
        (3, 4097),
        (100_001, 2),
        (1, 100_000),
    ] {
        // Small integers make ties common: the first index must win.
        let x: Vec<f32> = (0..rows * cols)
            .map(|_| r.random_range(0..6) as f32)
            .collect();
        let run = |d: &Device| -> Vec<u32> {
            ops::argmax(&tensor(d, &x, &[rows, cols]))
                .unwrap()
                .to_vec()
                .unwrap()
        };
        assert_eq!(
            run(dev),
            run(&reference()),
            "argmax {rows}x{cols} on {}",
            dev.backend_name()
        );
    }
}

/// NaN and ±inf go through every op where the reference defines the result.
fn special_values(dev: &Device) {
    let x = [
        1.0,
        f32::NAN,
        -2.0,
        f32::INFINITY,
        0.5,
        f32::NEG_INFINITY,
        3.0,
        -0.0,
    ];
    let y = [0.5f32, 2.0, f32::NAN, 1.0, f32::INFINITY, 2.0, -1.0, 4.0];
    for f in [ops::add as BinaryFn, ops::mul] {
        compare("binary with NaN/inf", dev, TOL, |d| {
            f(&tensor(d, &x, &[8]), &tensor(d, &y, &[8])).unwrap()
        });
    }
    compare("scale NaN/inf", dev, TOL, |d| {
        ops::scale(&tensor(d, &x, &[8]), 2.0).unwrap()
    });
    let softcap: UnaryFn = |t| ops::softcap(t, 3.0);
    for f in [
        ops::silu as UnaryFn,
        ops::gelu,
        ops::gelu_erf,
        ops::sigmoid,
        softcap,
    ] {
        let finite_or_nan = [1.0, f32::NAN, -2.0, 0.5, 3.0, -0.0];
        compare("activation NaN", dev, TOL, |d| {
            f(&tensor(d, &finite_or_nan, &[6])).unwrap()
        });
    }
    // A NaN poisons its row of a norm or softmax, and only that row.
    let rows = [1.0, 2.0, 3.0, 4.0, 1.0, f32::NAN, 3.0, 4.0];
    let w = [1.0f32; 4];
    compare("rms_norm NaN row", dev, TOL, |d| {
        ops::rms_norm(&tensor(d, &rows, &[2, 4]), &tensor(d, &w, &[4]), 1e-6).unwrap()
    });
    compare("softmax NaN row", dev, TOL, |d| {
        ops::softmax(&tensor(d, &rows, &[2, 4])).unwrap()
    });
    // -inf scores are masked-out keys: probability exactly 0.
    let scores = [0.0, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY];
    compare("softmax -inf", dev, TOL, |d| {
        ops::softmax(&tensor(d, &scores, &[1, 4])).unwrap()
    });
    let with_nan = [1.0, 5.0, f32::NAN, 7.0, 2.0, 9.0, 9.0, 1.0];
    let run = |d: &Device| -> Vec<u32> {
        ops::argmax(&tensor(d, &with_nan, &[2, 4]))
            .unwrap()
            .to_vec()
            .unwrap()
    };
    assert_eq!(
        run(dev),
        vec![2, 1],
        "argmax NaN/ties on {}",
        dev.backend_name()
    );
}

/// A chain of ops whose intermediates never leave the device, read once at the end.
fn chained(dev: &Device) {
    let mut r = rng(11);
    let (seq, dim, hidden) = (5, 64, 96);
    let x = uniform(&mut r, seq * dim, 1.0);
    let norm_w = uniform(&mut r, dim, 1.0);
    let w_gate = uniform(&mut r, hidden * dim, 0.2);
    let w_up = uniform(&mut r, hidden * dim, 0.2);
    let w_down = uniform(&mut r, dim * hidden, 0.2);
    compare("feed-forward chain", dev, TOL * 10.0, |d| {
        let t = |v: &[f32], s: &[usize]| tensor(d, v, s);
        let h = ops::rms_norm(&t(&x, &[seq, dim]), &t(&norm_w, &[dim]), 1e-5).unwrap();
        let gate = ops::matmul_t(&h, &t(&w_gate, &[hidden, dim])).unwrap();
        let up = ops::matmul_t(&h, &t(&w_up, &[hidden, dim])).unwrap();
        let act = ops::swiglu(&gate, &up).unwrap();
        let down = ops::matmul_t(&act, &t(&w_down, &[dim, hidden])).unwrap();
        ops::add(&t(&x, &[seq, dim]), &down).unwrap()
    });
}

// ---- quantized data (bit-exact against gguf-py's reference quantizers) ----------------------

/// The fixture files of `scripts/quant_fixtures.py`.
fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("native-tests/fixtures/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Equal values bit for bit, except that any NaN matches any NaN.
fn assert_same_values(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(same, "{what}: value {i}: got {g:e}, expected {w:e}");
    }
}

const GGUF_FORMATS: [(&str, DType); 4] = [
    ("q8_0", DType::Q8_0),
    ("q4_0", DType::Q4_0),
    ("tq1_0", DType::TQ1_0),
    ("tq2_0", DType::TQ2_0),
];

/// Quantize and dequantize match gguf-py byte for byte and value for value: ordinary, zero,
/// tiny (1e-30) and huge (1e30, whose f16 scale overflows to inf) rows, .5 ties and negative
/// maxima.
fn quant_gguf_fixtures(dev: &Device) {
    let input = f32s(&fixture("input.f32"));
    for (name, format) in GGUF_FORMATS {
        quantizes_like_gguf_py(dev, &input, name, format);
    }
}

/// `input` ([16, 256], `input.f32`) quantized to `format` is gguf-py's `{name}.bin` byte for
/// byte, and those bytes dequantize to gguf-py's `{name}.f32` value for value.
fn quantizes_like_gguf_py(dev: &Device, input: &[f32], name: &str, format: DType) {
    let want = quantize_matches_gguf_py(dev, input, name, format);
    let packed = Tensor::from_bytes(dev, format, want, [16, 256]).unwrap();
    let values: Vec<f32> = ops::dequantize(&packed).unwrap().to_vec().unwrap();
    assert_same_values(
        &format!("dequantize {name} on {}", dev.backend_name()),
        &values,
        &f32s(&fixture(&format!("{name}.f32"))),
    );
}

/// `input` ([16, 256], `input.f32`) quantized to `format` is gguf-py's `{name}.bin` byte for
/// byte; returns those bytes.
fn quantize_matches_gguf_py(dev: &Device, input: &[f32], name: &str, format: DType) -> Vec<u8> {
    let got = ops::quantize(&tensor(dev, input, &[16, 256]), format)
        .unwrap()
        .to_bytes()
        .unwrap();
    let want = fixture(&format!("{name}.bin"));
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!(
            "quantize {name} on {}: byte {i} (block {}) is {:#04x}, gguf-py wrote {:#04x}",
            dev.backend_name(),
            i / format.block_bytes(),
            got[i],
            want[i]
        );
    }
    assert_eq!(got.len(), want.len(), "quantize {name}: length");
    want
}

/// Every format on random rows of several shapes, and f16 at its edge cases, bit-exact against
/// the reference; ternary bit-planes against trits computed here independently.
fn quant_roundtrip(dev: &Device) {
    let mut r = rng(40);
    for (rows, cols) in [(1, 256), (3, 512), (5, 768), (0, 256)] {
        let mut x = uniform(&mut r, rows * cols, 3.0);
        if rows > 1 {
            x[cols..cols + 32].fill(0.0);
        }
        for format in [
            DType::Q8_0,
            DType::Q4_0,
            DType::TQ1_0,
            DType::TQ2_0,
            DType::TernaryPlanes,
            DType::F16,
        ] {
            let run = |d: &Device| {
                let q = ops::quantize(&tensor(d, &x, &[rows, cols]), format).unwrap();
                let back: Vec<f32> = ops::dequantize(&q).unwrap().to_vec().unwrap();
                (q.to_bytes().unwrap(), back)
            };
            let (bytes, back) = run(dev);
            let (want_bytes, want_back) = run(&reference());
            assert!(
                bytes == want_bytes,
                "quantize {format} {rows}x{cols} on {}",
                dev.backend_name()
            );
            assert_same_values(
                &format!("dequantize {format} {rows}x{cols}"),
                &back,
                &want_back,
            );
            if format == DType::TernaryPlanes {
                for (block, values) in x.chunks(256).zip(back.chunks(256)) {
                    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (v, b) in block.iter().zip(values) {
                        let trit = if amax == 0.0 {
                            0.0
                        } else {
                            (v * (1.0 / amax)).round()
                        };
                        assert_eq!(*b, trit * amax, "ternary planes value {v}");
                    }
                }
            }
        }
    }
    let edges = [
        0.0f32,
        -0.0,
        1.0,
        -2.5,
        65504.0,
        65519.0,
        65520.0,
        -1e6,
        6.1e-5,
        1e-7,
        2.9802322e-8,
        2.9802326e-8,
        5.96e-8,
        1e-30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.1,
        1.0 / 3.0,
    ];
    let run = |d: &Device| {
        let h = ops::quantize(&tensor(d, &edges, &[edges.len()]), DType::F16).unwrap();
        h.to_vec::<half::f16>().unwrap()
    };
    let want: Vec<half::f16> = edges.iter().map(|&v| half::f16::from_f32(v)).collect();
    let got = run(dev);
    for ((g, w), v) in got.iter().zip(&want).zip(edges) {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "f16 of {v:e} on {}",
            dev.backend_name()
        );
    }
}

fn packed_weight(d: &Device, w: &[f32], n: usize, k: usize, format: DType) -> Tensor {
    // Quantized on the reference, so the product test does not depend on quantize.
    let bytes = ops::quantize(&tensor(&reference(), w, &[n, k]), format)
        .unwrap()
        .to_bytes()
        .unwrap();
    Tensor::from_bytes(d, format, bytes, [n, k]).unwrap()
}

/// Products with packed weights against the reference on the dequantized weights, for every
/// format and activation mode, decode (m = 1) and prefill shapes, m beyond one row tile, n
/// across several column blocks.
/// Tolerance: matmul's 1e-5·√k (docs/DESIGN.md, Tolerances).
fn qmatmul(dev: &Device) {
    let mut r = rng(41);
    for (m, n, k) in [
        (1, 5, 256),
        (3, 33, 512),
        (9, 7, 768),
        (1, 1, 256),
        (17, 64, 256),
        // Several column blocks, a short last group of rows, and work enough for threads.
        (1, 300, 512),
        (3, 130, 512),
        (4, 13, 1280),
        // Prefill through the row-dot kernel: chunks of four activation rows (the last one
        // short) times several blocks of weight rows.
        (6, 300, 512),
        // Prefill through the tiled kernel on GPUs (`mm_tiled`): 64 × 64 output tiles, the
        // last ones short in both directions.
        (70, 130, 256),
        // Int8 activations rounded inside the decode kernel up to its most values (m · k ≤
        // 8192), then by the separate dispatch past it.
        (2, 40, 4096),
        (1, 40, 8192),
        (3, 40, 2816),
        (1, 40, 8448),
    ] {
        let a = uniform(&mut r, m * k, 2.0);
        let w = uniform(&mut r, n * k, 1.0);
        for format in [
            DType::F16,
            DType::Q8_0,
            DType::Q4_0,
            DType::TQ1_0,
            DType::TQ2_0,
            DType::TernaryPlanes,
        ] {
            let modes: &[Activations] = if format == DType::F16 {
                &[Activations::F32, Activations::F16]
            } else {
                &[Activations::F32, Activations::Q8_0, Activations::I8]
            };
            for &act in modes {
                let tol = TOL * (k as f64).sqrt();
                compare(
                    &format!("qmatmul {format} {act:?} {m}x{n}x{k}"),
                    dev,
                    tol,
                    |d| {
                        let mut a_t = tensor(d, &a, &[m, k]);
                        if act == Activations::F16 {
                            a_t = ops::quantize(&a_t, DType::F16).unwrap();
                        }
                        let w_t = packed_weight(d, &w, n, k, format);
                        ops::qmatmul_t(&a_t, &w_t, act).unwrap()
                    },
                );
            }
        }
    }
    // An odd count of 32-value blocks per row (Q8_0 and Q4_0 only: the other formats' blocks
    // are 256 values): odd rows then start two bytes into a word, and CPU adapters' decode
    // product leaves its pairs of blocks (`mv_pairs` in shaders/quant/) for the `idot` path.
    for (m, n, k) in [(1, 9, 96), (1, 33, 416), (2, 9, 96)] {
        let a = uniform(&mut r, m * k, 2.0);
        let w = uniform(&mut r, n * k, 1.0);
        for format in [DType::Q8_0, DType::Q4_0] {
            for act in [Activations::F32, Activations::Q8_0, Activations::I8] {
                compare(
                    &format!("qmatmul {format} {act:?} {m}x{n}x{k}"),
                    dev,
                    TOL * (k as f64).sqrt(),
                    |d| {
                        let a_t = tensor(d, &a, &[m, k]);
                        let w_t = packed_weight(d, &w, n, k, format);
                        ops::qmatmul_t(&a_t, &w_t, act).unwrap()
                    },
                );
            }
        }
    }
    // Weights so small that every f16 block scale is subnormal (below 2^-14): the products
    // convert them exactly, not flushed to zero as a driver's f16 conversion may. The outputs
    // are scaled up before the comparison, whose tolerance is relative to values of at least 1.
    for (m, n, k) in [(1, 40, 512), (3, 40, 512)] {
        let a = uniform(&mut r, m * k, 2.0);
        let w: Vec<f32> = uniform(&mut r, n * k, 1.0)
            .iter()
            .map(|v| v * 3e-5)
            .collect();
        for format in [DType::Q8_0, DType::Q4_0, DType::TQ1_0, DType::TQ2_0] {
            for act in [Activations::F32, Activations::Q8_0, Activations::I8] {
                compare(
                    &format!("qmatmul {format} {act:?} {m}x{n}x{k}, subnormal scales"),
                    dev,
                    TOL * (k as f64).sqrt(),
                    |d| {
                        let w_t = packed_weight(d, &w, n, k, format);
                        let out = ops::qmatmul_t(&tensor(d, &a, &[m, k]), &w_t, act).unwrap();
                        ops::scale(&out, 1e4).unwrap()
                    },
                );
            }
        }
    }
    // matmul_t takes packed weights too; f16 weights allow any k.
    let (m, n, k) = (2, 3, 37);
    let a = uniform(&mut r, m * k, 1.0);
    let w = uniform(&mut r, n * k, 1.0);
    compare("matmul_t f16 weight k=37", dev, TOL * 10.0, |d| {
        ops::matmul_t(
            &tensor(d, &a, &[m, k]),
            &packed_weight(d, &w, n, k, DType::F16),
        )
        .unwrap()
    });
}

/// Exact integer dots of ternary weights with int8 values, −128 included.
fn ternary_dot(dev: &Device) {
    let mut r = rng(42);
    for (m, n, k) in [(1, 3, 256), (5, 17, 512), (10, 2, 1024)] {
        let w = uniform(&mut r, n * k, 1.0);
        let x: Vec<i8> = (0..m * k)
            .map(|_| r.random_range(-128i32..128) as i8)
            .collect();
        for format in [DType::TQ1_0, DType::TQ2_0, DType::TernaryPlanes] {
            let run = |d: &Device| -> Vec<i32> {
                let w_t = packed_weight(d, &w, n, k, format);
                ops::ternary_dot(&w_t, &tensor(d, &x, &[m, k]))
                    .unwrap()
                    .to_vec()
                    .unwrap()
            };
            assert_eq!(
                run(dev),
                run(&reference()),
                "ternary_dot {format} {m}x{n}x{k} on {}",
                dev.backend_name()
            );
        }
    }
}

/// Concatenation along each axis, against the reference (exact: a copy).
fn concat(dev: &Device) {
    let mut r = rng(60);
    for (a_shape, b_shape, axis) in [
        (vec![3, 4], vec![2, 4], 0),
        (vec![3, 4], vec![3, 1], 1),
        (vec![2, 0, 5], vec![2, 7, 5], 1),
        (vec![4, 257, 3], vec![4, 255, 3], 1),
        (vec![1, 2, 70_001], vec![1, 2, 3], 2),
    ] {
        let a = uniform(&mut r, a_shape.iter().product(), 1.0);
        let b = uniform(&mut r, b_shape.iter().product(), 1.0);
        compare(
            &format!("concat {a_shape:?} {b_shape:?} axis {axis}"),
            dev,
            0.0,
            |d| ops::concat(&tensor(d, &a, &a_shape), &tensor(d, &b, &b_shape), axis).unwrap(),
        );
    }
}

/// The copy ops on u32 data (token ids kept on the device), exactly.
fn copies_of_ids(dev: &Device) {
    let a: Vec<u32> = (0..12).collect();
    let b: Vec<u32> = (100..106).collect();
    let run = |d: &Device| -> (Vec<u32>, Vec<u32>) {
        let joined = ops::concat(&tensor(d, &a, &[3, 4]), &tensor(d, &b, &[3, 2]), 1).unwrap();
        let part = ops::narrow(&joined, 1, 3, 2).unwrap();
        (joined.to_vec().unwrap(), part.to_vec().unwrap())
    };
    assert_eq!(run(dev), run(&reference()), "on {}", dev.backend_name());
}

/// In-place writes and region copies (`Tensor::write`, `Tensor::copy_from`: how a decode
/// step's inputs are updated between steps), exact against a plain loop: awkward lengths,
/// a copy from an op's output still in flight, and each ordered with the ops recorded before
/// (which read the old contents) and after it.
fn write_and_copy_from(dev: &Device) {
    let mut r = rng(68);
    for len in [1, 3, 257, 4097] {
        let (old, new) = (uniform(&mut r, len, 2.0), uniform(&mut r, len, 2.0));
        let mut x = tensor(dev, &old, &[len]);
        let before = ops::scale(&x, 2.0).unwrap();
        x.write(&new).unwrap();
        let after = ops::scale(&x, 2.0).unwrap();
        let twice = |v: &[f32]| v.iter().map(|a| a * 2.0).collect::<Vec<f32>>();
        let what = format!("write len {len} on {}", dev.backend_name());
        assert_eq!(
            before.to_vec::<f32>().unwrap(),
            twice(&old),
            "{what}: before"
        );
        assert_eq!(after.to_vec::<f32>().unwrap(), twice(&new), "{what}: after");
        assert_eq!(x.to_vec::<f32>().unwrap(), new, "{what}");
        assert!(x.write(&new[1..]).is_err(), "{what}: a shorter write");
    }
    let mut ids = tensor(dev, &[0u32; 9], &[9]);
    let src = tensor(dev, &(100..113).collect::<Vec<u32>>(), &[13]);
    ids.copy_from(2, &src, 11, 2).unwrap();
    // The index of the largest of each row, copied as the engine feeds a drawn id on.
    let rows = tensor(dev, &[0.5f32, 3.0, -1.0, 9.0, 2.0, 1.0], &[2, 3]);
    let best = ops::argmax(&rows).unwrap();
    ids.copy_from(7, &best, 0, 2).unwrap();
    let read_before = ops::narrow(&ids, 0, 0, 4).unwrap();
    ids.copy_from(0, &src, 0, 1).unwrap();
    assert_eq!(
        ids.to_vec::<u32>().unwrap(),
        vec![100, 0, 111, 112, 0, 0, 0, 1, 0],
        "copy_from on {}",
        dev.backend_name()
    );
    assert_eq!(read_before.to_vec::<u32>().unwrap(), vec![0, 0, 111, 112]);
    assert!(ids.copy_from(8, &src, 0, 2).is_err(), "past the target");
    assert!(ids.copy_from(0, &src, 12, 2).is_err(), "past the source");
}

/// Slices along each axis, against the reference (exact: a copy).
fn narrow(dev: &Device) {
    let mut r = rng(61);
    for (shape, axis, start, len) in [
        (vec![5, 4], 0, 1, 3),
        (vec![5, 4], 1, 3, 1),
        (vec![2, 7, 5], 1, 0, 0),
        (vec![4, 257, 3], 1, 100, 157),
        (vec![1, 2, 70_001], 2, 7, 69_000),
    ] {
        let x = uniform(&mut r, shape.iter().product(), 1.0);
        compare(
            &format!("narrow {shape:?} axis {axis} {start}+{len}"),
            dev,
            0.0,
            |d| ops::narrow(&tensor(d, &x, &shape), axis, start, len).unwrap(),
        );
    }
}

/// In-place row writes, against a plain loop in the test (exact: a copy), including the
/// write staying ordered with the reads recorded before and after it.
fn scatter_rows(dev: &Device) {
    let mut r = rng(62);
    for (shape, count) in [
        (vec![1, 1], 1),
        (vec![5, 3], 0),
        (vec![300, 257], 7),
        (vec![64, 4, 16], 64),
        (vec![4097, 3], 255),
    ] {
        let rows = shape[0];
        let cols: usize = shape[1..].iter().product();
        let init = uniform(&mut r, rows * cols, 1.0);
        let src = uniform(&mut r, count * cols, 1.0);
        // Distinct slots in a scrambled order.
        let slots: Vec<u32> = (0..count).map(|i| ((i * 7919 + 3) % rows) as u32).collect();
        let mut slot_set = slots.clone();
        slot_set.sort_unstable();
        slot_set.dedup();
        assert_eq!(slot_set.len(), count, "test slots must be distinct");
        let mut want = init.clone();
        for (i, &s) in slots.iter().enumerate() {
            let s = s as usize;
            want[s * cols..(s + 1) * cols].copy_from_slice(&src[i * cols..(i + 1) * cols]);
        }
        let mut src_shape = shape.clone();
        src_shape[0] = count;
        let mut dst = tensor(dev, &init, &shape);
        let before = ops::scale(&dst, 1.0).unwrap();
        let alias = dst.clone();
        ops::scatter_rows(
            &mut dst,
            &tensor(dev, &slots, &[count]),
            &tensor(dev, &src, &src_shape),
        )
        .unwrap();
        let after = ops::scale(&dst, 1.0).unwrap();
        let what = format!(
            "scatter_rows {shape:?} count {count} on {}",
            dev.backend_name()
        );
        assert_eq!(dst.to_vec::<f32>().unwrap(), want, "{what}");
        assert_eq!(
            after.to_vec::<f32>().unwrap(),
            want,
            "{what}: a read recorded after"
        );
        assert_eq!(
            before.to_vec::<f32>().unwrap(),
            init,
            "{what}: a read recorded before"
        );
        assert_eq!(
            alias.to_vec::<f32>().unwrap(),
            init,
            "{what}: a clone keeps its values"
        );
    }
    // u32 rows, written twice in a row without a readback in between.
    let mut ids = tensor(dev, &[0u32; 8], &[4, 2]);
    ops::scatter_rows(
        &mut ids,
        &tensor(dev, &[3u32, 0], &[2]),
        &tensor(dev, &[1u32, 2, 3, 4], &[2, 2]),
    )
    .unwrap();
    ops::scatter_rows(
        &mut ids,
        &tensor(dev, &[1u32], &[1]),
        &tensor(dev, &[5u32, 6], &[1, 2]),
    )
    .unwrap();
    assert_eq!(ids.to_vec::<u32>().unwrap(), [3, 4, 5, 6, 0, 0, 1, 2]);
}

/// `p` as parameters.
fn sampling(temperature: f32, top_k: u32, top_p: f32) -> SampleParams {
    SampleParams {
        temperature,
        top_k,
        top_p,
    }
}

/// Drawing tokens: the same tokens as the reference (a difference only where a slightly moved
/// number or top-p cut explains it), and, independently of any backend, the frequencies of a
/// fine grid of numbers against softmax probabilities computed here.
fn sample(dev: &Device) {
    let mut r = rng(63);
    let params = [
        sampling(0.0, 0, 1.0),
        sampling(0.7, 0, 1.0),
        sampling(1.0, 1, 1.0),
        sampling(1.3, 40, 1.0),
        sampling(0.8, 0, 0.9),
        sampling(1.0, 50, 0.8),
        sampling(1.0, 0, 0.0),
        sampling(2.0, 100_000, 0.5),
    ];
    for (rows, vocab) in [(3, 1), (4, 3), (5, 255), (3, 257), (2, 4097), (2, 32_000)] {
        let mut logits = uniform(&mut r, rows * vocab, 6.0);
        if vocab > 3 {
            // A tie for the maximum, a NaN and -inf, which must never be drawn.
            logits[0] = 7.0;
            logits[2] = 7.0;
            logits[1] = f32::NAN;
            logits[3] = f32::NEG_INFINITY;
        }
        let u: Vec<f32> = (0..rows).map(|_| r.random_range(0.0..1.0)).collect();
        for p in params {
            let what = format!("sample {rows}x{vocab} {p:?} on {}", dev.backend_name());
            let run = |d: &Device, u: &[f32], p: SampleParams| -> Vec<u32> {
                ops::sample(
                    &tensor(d, &logits, &[rows, vocab]),
                    &tensor(d, u, &[rows]),
                    p,
                )
                .unwrap()
                .to_vec()
                .unwrap()
            };
            let got = run(dev, &u, p);
            let want = run(&reference(), &u, p);
            for row in 0..rows {
                let id = got[row] as usize;
                assert!(
                    id < vocab && !logits[row * vocab + id].is_nan(),
                    "{what}: row {row} drew {id}"
                );
                if got[row] == want[row] {
                    continue;
                }
                // Explained by rounding: a nudged number or top-p cut gives the same token.
                let nudged = [(-1e-4, 0.0), (1e-4, 0.0), (0.0, -1e-4), (0.0, 1e-4)]
                    .iter()
                    .any(|&(du, dp)| {
                        let mut u2 = u.clone();
                        u2[row] = (u[row] + du).clamp(0.0, 0.999_999);
                        let p2 = sampling(p.temperature, p.top_k, p.top_p + dp);
                        run(&reference(), &u2, p2)[row] == got[row]
                    });
                assert!(
                    nudged,
                    "{what}: row {row} drew {} where the reference drew {}",
                    got[row], want[row]
                );
            }
        }
    }
    // Greedy rows longer than a chunk of the wgpu kernels (2048): a tie across chunks keeps
    // the first index, +inf wins from a later chunk, a row of NaN gives 0 (the definition
    // in `SampleParams`, independently of any backend).
    let vocab = 5000;
    let mut logits = uniform(&mut r, 3 * vocab, 6.0);
    logits[4100] = 9.0;
    logits[2100] = 9.0;
    logits[vocab + 4999] = f32::INFINITY;
    logits[vocab + 4998] = f32::NAN;
    logits[2 * vocab..].fill(f32::NAN);
    let greedy: Vec<u32> = ops::sample(
        &tensor(dev, &logits, &[3, vocab]),
        &tensor(dev, &[0.5; 3], &[3]),
        sampling(0.0, 0, 1.0),
    )
    .unwrap()
    .to_vec()
    .unwrap();
    assert_eq!(
        greedy,
        [2100, 4999, 0],
        "greedy rows over chunks on {}",
        dev.backend_name()
    );
    // Frequencies over a grid of numbers: each token's share of [0, 1) is its probability.
    let logits = [1.0f32, -0.5, 2.0, 0.25, 2.0, -3.0, 0.5];
    let n = 4000;
    let grid: Vec<f32> = (0..n).map(|i| (i as f32 + 0.5) / n as f32).collect();
    let batch: Vec<f32> = logits
        .iter()
        .copied()
        .cycle()
        .take(n * logits.len())
        .collect();
    for (t, k, top_p) in [(1.0, 0, 1.0), (0.6, 3, 1.0), (1.5, 0, 0.7), (1.0, 5, 0.9)] {
        let drawn: Vec<u32> = ops::sample(
            &tensor(dev, &batch, &[n, logits.len()]),
            &tensor(dev, &grid, &[n]),
            sampling(t, k, top_p),
        )
        .unwrap()
        .to_vec()
        .unwrap();
        let probs = expected_probs(&logits, t as f64, k, top_p as f64);
        for (id, &prob) in probs.iter().enumerate() {
            let share = drawn.iter().filter(|&&d| d as usize == id).count() as f64 / n as f64;
            assert!(
                (share - prob).abs() <= 2.0 / n as f64,
                "sample grid t={t} k={k} p={top_p} on {}: token {id} drawn {share}, probability {prob}",
                dev.backend_name()
            );
        }
    }
}

/// The probabilities temperature, top-k and top-p leave, by brute force: sort, cut, softmax.
fn expected_probs(x: &[f32], t: f64, k: u32, top_p: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let w: Vec<f64> = x.iter().map(|&v| (v as f64 / t).exp()).collect();
    let mut keep = if k == 0 { x.len() } else { k as usize };
    while keep < x.len() && x[order[keep]] == x[order[keep - 1]] {
        keep += 1;
    }
    let total: f64 = order[..keep].iter().map(|&i| w[i]).sum();
    let mut sum = 0.0;
    for n in 0..keep {
        sum += w[order[n]];
        if sum >= top_p * total {
            keep = n + 1;
            break;
        }
    }
    while keep < x.len() && x[order[keep]] == x[order[keep - 1]] {
        keep += 1;
    }
    let kept = &order[..keep];
    let total: f64 = kept.iter().map(|&i| w[i]).sum();
    (0..x.len())
        .map(|i| if kept.contains(&i) { w[i] / total } else { 0.0 })
        .collect()
}

// ---- scans ----------------------------------------------------------------------------------

/// (shape, axis) cases: empty, single steps, lengths around the wgpu kernels' boundaries (64
/// steps run one thread per channel, 65 the first chunked scan, 512-step chunks), three axes,
/// and sequences of 100k+ steps where rounding error would grow.
const SCAN_CASES: [(&[usize], usize); 13] = [
    (&[0, 4], 0),
    (&[1], 0),
    (&[4, 3], 1),
    (&[3, 5], 1),
    (&[3, 64, 2], 1),
    (&[65, 3], 0),
    (&[2, 255, 3], 1),
    (&[2, 257], 1),
    (&[513, 4], 0),
    (&[2, 3, 4097], 2),
    (&[1, 100_003, 1], 1),
    (&[2, 120_000, 3], 1),
    (&[4097, 2, 2], 0),
];

/// `n` values in `[lo, hi)`.
fn in_range(r: &mut rand::rngs::StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

/// Scan tolerance: 1e-5 relative to the output scale, times log2 of the length. A parallel
/// scan combines each output from ⌈log2 len⌉ levels of partial results, each adding a few
/// f32 roundings, so its error grows with the depth of the tree, not with the length
/// (a sequential f32 loop would grow with √len or len).
fn scan_tol(len: usize) -> f64 {
    TOL * (len.max(2) as f64).log2()
}

/// Tolerance of `log_cumprod` (relative to the output scale): `y_t = exp(S_t)` carries the
/// absolute error of the sum `S_t = Σ ln a_s` as a relative error. So each `ln` must be good
/// to a few ulp, not merely to WGSL's absolute 2^-21 near 1: a driver whose `log` errs with
/// one sign (NVIDIA's, about 3e-8 per term) drifts linearly with the length, 1.2e-4 at 4097
/// terms and 3e-3 at 100003. The backends compute `ln` themselves where the platform's is
/// loose, so the scan's own tolerance applies.
fn log_cumprod_tol(len: usize) -> f64 {
    scan_tol(len)
}

fn state_dims(shape: &[usize], axis: usize) -> Vec<usize> {
    let mut d = shape.to_vec();
    d.remove(axis);
    d
}

fn linear_scan(dev: &Device) {
    let mut r = rng(50);
    for (shape, axis) in SCAN_CASES {
        let n: usize = shape.iter().product();
        // |a| < 1 keeps h bounded (as in a stable state-space model); a near 1 in one run.
        let hi = if n > 100_000 { 0.9999 } else { 0.99 };
        let a = in_range(&mut r, n, 0.5, hi);
        let b = uniform(&mut r, n, 1.0);
        let h0_dims = state_dims(shape, axis);
        let h0 = uniform(&mut r, h0_dims.iter().product(), 2.0);
        let what = format!("linear_scan {shape:?} axis {axis}");
        compare(&what, dev, scan_tol(shape[axis]), |d| {
            ops::linear_scan(
                &tensor(d, &a, shape),
                &tensor(d, &b, shape),
                &tensor(d, &h0, &h0_dims),
                axis,
            )
            .unwrap()
        });
    }
}

fn log_scans(dev: &Device) {
    let mut r = rng(51);
    for (shape, axis) in SCAN_CASES {
        let n: usize = shape.iter().product();
        // Factors around 1 keep the product within f32 over 100k steps.
        let a = in_range(&mut r, n, 0.97, 1.03);
        let x = uniform(&mut r, n, 30.0);
        let what = format!("{shape:?} axis {axis}");
        compare(
            &format!("log_cumprod {what}"),
            dev,
            log_cumprod_tol(shape[axis]),
            |d| ops::log_cumprod(&tensor(d, &a, shape), axis).unwrap(),
        );
        compare(
            &format!("logcumsumexp {what}"),
            dev,
            scan_tol(shape[axis]),
            |d| ops::logcumsumexp(&tensor(d, &x, shape), axis).unwrap(),
        );
    }
    // Zeros and negatives in the product; −∞ in log-sum-exp.
    let special = [2.0f32, 0.5, 0.0, 3.0, -1.0, 2.0];
    compare("log_cumprod special", dev, TOL, |d| {
        ops::log_cumprod(&tensor(d, &special, &[2, 3]), 1).unwrap()
    });
    let ninf = f32::NEG_INFINITY;
    let lse = [ninf, ninf, 1.0, ninf, 2.0, -3.0];
    compare("logcumsumexp -inf", dev, TOL, |d| {
        ops::logcumsumexp(&tensor(d, &lse, &[6]), 0).unwrap()
    });
    // NaN poisons the rest of its channel (and only that channel); +inf stays +inf. Long enough
    // (600 steps) that the wgpu backend takes its chunked path, NaN in the second chunk.
    let mut poisoned = vec![0.5f32; 2 * 600];
    poisoned[530] = f32::NAN;
    poisoned[1200 - 70] = f32::INFINITY;
    compare("logcumsumexp NaN/inf", dev, TOL, |d| {
        ops::logcumsumexp(&tensor(d, &poisoned, &[2, 600]), 1).unwrap()
    });
    compare("log_cumprod NaN/inf", dev, TOL, |d| {
        ops::log_cumprod(&tensor(d, &poisoned, &[2, 600]), 1).unwrap()
    });
    // The linear scan only with NaN: an infinite `a` meets products of many factors that
    // underflowed to 0 in a parallel scan (0·∞ = NaN where the sequential definition gives ∞),
    // as the op's documentation says.
    poisoned[1200 - 70] = 0.5;
    compare("linear_scan NaN", dev, TOL, |d| {
        let x = tensor(d, &poisoned, &[2, 600]);
        ops::linear_scan(&x, &x, &tensor(d, &[1.0f32, -1.0], &[2]), 1).unwrap()
    });
}

/// The backward pass against the reference, and the reference's own gradients against
/// central finite differences of its forward pass (in f64 through the loss Σ w·h).
fn scan_backward(dev: &Device) {
    let mut r = rng(52);
    for (shape, axis) in SCAN_CASES {
        let n: usize = shape.iter().product();
        let a = in_range(&mut r, n, 0.5, 0.99);
        let b = uniform(&mut r, n, 1.0);
        let h0_dims = state_dims(shape, axis);
        let h0 = uniform(&mut r, h0_dims.iter().product(), 1.0);
        let gh = uniform(&mut r, n, 1.0);
        let grads = |d: &Device| {
            let (a_t, h0_t) = (tensor(d, &a, shape), tensor(d, &h0, &h0_dims));
            let h = ops::linear_scan(&a_t, &tensor(d, &b, shape), &h0_t, axis).unwrap();
            let (ga, gb, g0) =
                ops::linear_scan_backward(&a_t, &h0_t, &h, &tensor(d, &gh, shape), axis).unwrap();
            [ga, gb, g0].map(|t| t.to_vec::<f32>().unwrap())
        };
        let got = grads(dev);
        let want = grads(&reference());
        for (name, (g, w)) in ["grad_a", "grad_b", "grad_h0"]
            .iter()
            .zip(got.iter().zip(&want))
        {
            let what = format!("{name} {shape:?} axis {axis} on {}", dev.backend_name());
            assert_close(&what, g, w, 10.0 * scan_tol(shape[axis]));
        }
    }
    // Finite differences on a small case (the reference is the definition being checked).
    let (shape, axis) = ([2usize, 7, 3], 1);
    let n = 42;
    let a = in_range(&mut r, n, 0.5, 0.99);
    let b = uniform(&mut r, n, 1.0);
    let h0 = uniform(&mut r, 6, 1.0);
    let w = uniform(&mut r, n, 1.0);
    let loss = |a: &[f32], b: &[f32], h0: &[f32]| -> f64 {
        let d = reference();
        let h = ops::linear_scan(
            &tensor(&d, a, &shape),
            &tensor(&d, b, &shape),
            &tensor(&d, h0, &[2, 3]),
            axis,
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
        h.iter().zip(&w).map(|(&h, &w)| h as f64 * w as f64).sum()
    };
    let d = reference();
    let (a_t, h0_t) = (tensor(&d, &a, &shape), tensor(&d, &h0, &[2, 3]));
    let h = ops::linear_scan(&a_t, &tensor(&d, &b, &shape), &h0_t, axis).unwrap();
    let (ga, gb, g0) =
        ops::linear_scan_backward(&a_t, &h0_t, &h, &tensor(&d, &w, &shape), axis).unwrap();
    let eps = 1e-2f32;
    let numeric = |v: &[f32], i: usize, f: &dyn Fn(&[f32]) -> f64| {
        let (mut up, mut down) = (v.to_vec(), v.to_vec());
        up[i] += eps;
        down[i] -= eps;
        ((f(&up) - f(&down)) / (2.0 * eps as f64)) as f32
    };
    let [ga, gb, g0] = [ga, gb, g0].map(|t| t.to_vec::<f32>().unwrap());
    for (i, (&want_a, &want_b)) in ga.iter().zip(&gb).enumerate() {
        let fa = numeric(&a, i, &|x| loss(x, &b, &h0));
        let fb = numeric(&b, i, &|x| loss(&a, x, &h0));
        assert!((fa - want_a).abs() < 1e-3, "grad_a[{i}]: {fa} vs {want_a}");
        assert!((fb - want_b).abs() < 1e-3, "grad_b[{i}]: {fb} vs {want_b}");
    }
    for (i, &want) in g0.iter().enumerate() {
        let f0 = numeric(&h0, i, &|x| loss(&a, &b, x));
        assert!((f0 - want).abs() < 1e-3, "grad_h0[{i}]: {f0} vs {want}");
    }
}

/// Unit roundoff of f32.
const F32_U: f64 = f32::EPSILON as f64 / 2.0;

/// Per-element check of a long linear scan against the forward error bound of an affine scan
/// evaluated in f32 by any bracketing of depth `depth` (Higham, ch. 3, applied to
/// `h_t = Σ_s (Π_{s<r≤t} a_r)·b_s + (Π_{r≤t} a_r)·h0`): every combine rounds a product and a
/// multiply-add, so `|ĥ_t − h_t| ≤ γ_{3·depth} · habs_t` with `habs_t` the same scan over
/// `|a|`, `|b|`, `|h0|` (computed by the reference). The parallel scans' depth is at most
/// `2·log2(len) + 8` (up- and down-sweeps, the carry, the final combine); the bound also covers
/// the final rounding to f32 (`u·|h_t|`). With |a| near 1 and b of mixed signs, `habs_t` grows
/// like `t` while `h_t` grows like `√t`, so this bound is what an f32 scan can promise, and it is
/// larger than `1e-5·log2(len)·max|h|`; the measured errors are checked to be far below it.
fn assert_scan_bound(what: &str, got: &[f32], want: &[f32], habs: &[f32], len: usize) {
    let depth = 2.0 * (len.max(2) as f64).log2() + 8.0;
    let k = 3.0 * depth * F32_U;
    let gamma = k / (1.0 - k);
    let mut worst = (0f64, 0usize);
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(habs).enumerate() {
        let bound = gamma * m as f64 + F32_U * (w as f64).abs() + f64::from(f32::MIN_POSITIVE);
        let ratio = (g as f64 - w as f64).abs() / bound;
        assert!(
            ratio <= 1.0,
            "{what}: element {i}: got {g}, expected {w}, error bound {bound:.3e}"
        );
        if ratio > worst.0 {
            worst = (ratio, i);
        }
    }
    if std::env::var_os("WEBTENSOR_SHOW_ERRORS").is_some() {
        let max_abs = got
            .iter()
            .zip(want)
            .map(|(&g, &w)| (g as f64 - w as f64).abs())
            .fold(0f64, f64::max);
        let scale = want.iter().fold(1f64, |m, &w| m.max((w as f64).abs()));
        eprintln!(
            "{what}: max abs error {max_abs:.3e} (scale {scale:.3e}, {:.3e} relative); \
             worst element at {:.3} of its bound",
            max_abs / scale,
            worst.0
        );
    }
}

/// Linear scans whose |a| is near 1 over 100k+ steps (long memory: the regime where rounding
/// error grows), forward and the adjoint of the backward pass, checked element by element
/// against the error bound of [`assert_scan_bound`]. One case has a of both signs.
fn scan_near_one(dev: &Device) {
    let mut r = rng(53);
    let cases: [(&[usize], usize, f32, bool); 3] = [
        (&[1, 200_003, 1], 1, 0.9999, true),
        (&[2, 120_000, 3], 1, 0.999, false),
        (&[100_001, 2], 0, 0.99999, false),
    ];
    for (shape, axis, lo, signed) in cases {
        let n: usize = shape.iter().product();
        let len = shape[axis];
        let a: Vec<f32> = (0..n)
            .map(|_| {
                let v = r.random_range(lo..1.0f32);
                if signed && r.random_bool(0.5) {
                    -v
                } else {
                    v
                }
            })
            .collect();
        let b = uniform(&mut r, n, 1.0);
        let h0_dims = state_dims(shape, axis);
        let h0 = uniform(&mut r, h0_dims.iter().product(), 2.0);
        let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        let scan = |d: &Device, a: &[f32], b: &[f32], h0: &[f32]| {
            ops::linear_scan(
                &tensor(d, a, shape),
                &tensor(d, b, shape),
                &tensor(d, h0, &h0_dims),
                axis,
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
        };
        let want = scan(&reference(), &a, &b, &h0);
        let habs = scan(&reference(), &abs(&a), &abs(&b), &abs(&h0));
        let what = format!(
            "linear_scan |a|≥{lo} {shape:?} axis {axis} on {}",
            dev.backend_name()
        );
        assert_scan_bound(&what, &scan(dev, &a, &b, &h0), &want, &habs, len);
        // The adjoint (grad_b) is the same scan run backwards over (a shifted, grad_h).
        let adjoint = |d: &Device, a: &[f32], gh: &[f32]| {
            let (a_t, h0_t) = (tensor(d, a, shape), tensor(d, &h0, &h0_dims));
            let h = tensor(d, &want, shape);
            let (_, gb, _) =
                ops::linear_scan_backward(&a_t, &h0_t, &h, &tensor(d, gh, shape), axis).unwrap();
            gb.to_vec::<f32>().unwrap()
        };
        let gh = uniform(&mut r, n, 1.0);
        let want = adjoint(&reference(), &a, &gh);
        let gabs = adjoint(&reference(), &abs(&a), &abs(&gh));
        let what = format!(
            "grad_b |a|≥{lo} {shape:?} axis {axis} on {}",
            dev.backend_name()
        );
        assert_scan_bound(&what, &adjoint(dev, &a, &gh), &want, &gabs, len);
    }
}

/// More channels than one grid dimension holds (65,535 workgroups): the chunked wgpu scan
/// spreads its per-channel and per-chunk workgroups over a 2-D grid.
fn scan_many_channels(dev: &Device) {
    let mut r = rng(54);
    let shape = [66, 66_000];
    let n = shape[0] * shape[1];
    let a = in_range(&mut r, n, 0.5, 0.99);
    let b = uniform(&mut r, n, 1.0);
    let h0 = uniform(&mut r, shape[1], 1.0);
    compare("linear_scan [66, 66000] axis 0", dev, scan_tol(66), |d| {
        ops::linear_scan(
            &tensor(d, &a, &shape),
            &tensor(d, &b, &shape),
            &tensor(d, &h0, &shape[1..]),
            0,
        )
        .unwrap()
    });
}

/// A cpu device whose kernels run on `level`, checked in its `info`, or `None` (with a
/// printed reason) where this CPU lacks the level.
fn cpu_simd(level: SimdLevel) -> Option<Device> {
    if !level.is_supported() {
        eprintln!("skipping: this CPU cannot run {level}");
        return None;
    }
    let mut options = BackendOptions::default();
    options.cpu.simd = Some(level);
    let dev = Device::with_options("cpu", options).unwrap();
    let simd = dev.info().simd;
    assert_eq!(
        simd.as_deref(),
        Some(level.name()),
        "the cpu backend's SIMD level"
    );
    Some(dev)
}

/// A wgpu device started with the options `set` makes, after asserting that the kernel
/// variants `on` are in effect and `off` are not (`info().variants`).
fn wgpu_variant(
    set: impl FnOnce(&mut BackendOptions),
    on: &[&str],
    off: &[&str],
) -> Option<Device> {
    let mut options = BackendOptions::default();
    set(&mut options);
    let dev = common::wgpu_with(options.clone())?;
    assert_eq!(dev.options(), &options);
    let variants = dev.info().variants;
    for v in on {
        assert!(
            variants.iter().any(|x| x == v),
            "{v} must be on: {variants:?}"
        );
    }
    for v in off {
        assert!(
            !variants.iter().any(|x| x == v),
            "{v} must be off: {variants:?}"
        );
    }
    Some(dev)
}

/// Each option that turns a kernel variant off changes what the backend runs, here: a variant
/// the default device has is gone from the device with the option, and the row-team shape
/// follows `row_teams` both ways. (The variant tests below assert the same of their devices;
/// this one also fails when an option is ignored on an adapter where it matters.)
#[test]
fn wgpu_options_change_the_kernel_variants() {
    let Some(default) = common::wgpu() else {
        return;
    };
    let has = |d: &Device, v: &str| d.info().variants.iter().any(|x| x == v);
    type Set = fn(&mut BackendOptions);
    let cases: [(&str, Set); 4] = [
        ("shader_f16", |o| o.wgpu.shader_f16 = false),
        ("int_dot", |o| o.wgpu.int_dot = false),
        ("weight_texels", |o| o.wgpu.weight_texels = false),
        ("profile", |o| o.wgpu.profile = true),
    ];
    let mut changed = 0;
    for (variant, set) in cases {
        let mut options = BackendOptions::default();
        set(&mut options);
        let dev = common::wgpu_with(options).unwrap();
        if variant == "profile" {
            // On only where the adapter has timestamp queries; never on by default.
            assert!(!has(&default, variant));
            changed += has(&dev, variant) as usize;
        } else if has(&default, variant) {
            assert!(!has(&dev, variant), "{variant} stayed on");
            changed += 1;
        }
    }
    for teams in [Switch::On, Switch::Off] {
        let mut options = BackendOptions::default();
        options.wgpu.row_teams = teams;
        let dev = common::wgpu_with(options).unwrap();
        assert_eq!(
            has(&dev, "row_teams"),
            teams == Switch::On,
            "row_teams {teams:?}"
        );
    }
    eprintln!("{changed} options changed a variant the default device has");
}

/// One test per op and variant: `$name::$op` runs `$op` on the device `$device` gives.
macro_rules! variant {
    ($name:ident, $device:expr, [$($op:ident),* $(,)?]) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $( #[test] fn $op() { if let Some(d) = $device { super::$op(&d) } } )*
        }
    };
}

macro_rules! matrix {
    ($($op:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $op() { super::$op(&super::common::cpu()) } )*
        }
        mod wgpu {
            $( #[test] fn $op() { if let Some(d) = super::common::wgpu() { super::$op(&d) } } )*
        }
        mod cuda {
            $( #[test] fn $op() { if let Some(d) = super::common::cuda() { super::$op(&d) } } )*
        }
        // The cpu rows once per SIMD path.
        variant!(cpu_scalar, cpu_simd(SimdLevel::Scalar), [$($op),*]);
        variant!(cpu_avx2, cpu_simd(SimdLevel::Avx2), [$($op),*]);
        variant!(cpu_avx512, cpu_simd(SimdLevel::Avx512), [$($op),*]);
    };
}

// The wgpu f16 products for adapters without shader-f16 (`unpack2x16float`).
variant!(
    wgpu_f16_off,
    wgpu_variant(|o| o.wgpu.shader_f16 = false, &[], &["shader_f16"]),
    [qmatmul, kquant_products, legacy_products, bf16_products]
);

// The int8-activation decode products with `idot4` written out, for platforms without WGSL's
// dot4I8Packed (every native one has it).
variant!(
    wgpu_int_dot_off,
    wgpu_variant(|o| o.wgpu.int_dot = false, &[], &["int_dot"]),
    [qmatmul, linear_residual, swiglu_linear]
);

// On CPU adapters (the lanes shape) a Q4_0 decode product reads the texel copy the backend
// keeps of uploaded Q4_0 tensors (`mv_pairs_texels`); without one (a tensor made on the
// device, or too large for a texture) it reads the storage words (`mv_pairs_lanes`), as here.
variant!(
    wgpu_texels_off,
    wgpu_variant(|o| o.wgpu.weight_texels = false, &[], &["weight_texels"]),
    [
        qmatmul,
        linear_residual,
        swiglu_linear,
        norm_linear,
        norm_linear_rope,
        norm_linear_into,
        norm_linears_into,
        norm_swiglu_linear,
    ]
);

// The decode matvecs' GPU shape (row teams) on any adapter (a software one's default is one
// lane per rows): reduced with subgroupAdd where the adapter has subgroups, with the GPU
// kernels of the RMS norm and of attention (a workgroup per row, per query and head). Only
// with row teams does the decode product round its int8 activations itself, with the norm and
// the rope folded in (the `norm_` rows; the lanes shape norms them in its own rounding
// dispatch, `quantize_acts_normed`), and prefill products with packed weights run the tiled
// `mm_tiled` (with the fused ops' epilogues).
variant!(
    wgpu_row_teams,
    wgpu_variant(
        |o| o.wgpu.row_teams = Switch::On,
        &["row_teams"],
        &["weight_texels"]
    ),
    [
        qmatmul,
        kquant_products,
        legacy_products,
        bf16_products,
        matmul,
        linear_residual,
        swiglu_linear,
        norm_linear,
        norm_linear_rope,
        norm_linear_into,
        norm_linears_into,
        norm_swiglu_linear,
        rms_norm,
        paged_attention,
    ]
);

// Row teams reduced through workgroup memory.
variant!(
    wgpu_row_teams_workgroup,
    wgpu_variant(
        |o| {
            o.wgpu.row_teams = Switch::On;
            o.wgpu.subgroups = false;
        },
        &["row_teams"],
        &["subgroups"]
    ),
    [
        qmatmul,
        kquant_products,
        legacy_products,
        bf16_products,
        matmul
    ]
);

// Row teams with prefill products through the row-dot kernel instead of the tiles.
variant!(
    wgpu_row_teams_untiled,
    wgpu_variant(
        |o| {
            o.wgpu.row_teams = Switch::On;
            o.wgpu.tiled_prefill = false;
        },
        &["row_teams"],
        &["tiled_prefill"]
    ),
    [
        qmatmul,
        kquant_products,
        legacy_products,
        bf16_products,
        linear_residual
    ]
);

matrix!(
    unary,
    binary,
    rms_norm,
    layer_norm,
    softmax,
    rope,
    matmul,
    embedding,
    permute,
    argmax,
    special_values,
    chained,
    quant_gguf_fixtures,
    quant_roundtrip,
    llama_cpp_formats_gguf_fixtures,
    llama_cpp_formats_qmatmul,
    kquant_products,
    legacy_products,
    bf16_products,
    qmatmul,
    ternary_dot,
    linear_scan,
    log_scans,
    scan_backward,
    scan_near_one,
    scan_many_channels,
    concat,
    narrow,
    copies_of_ids,
    write_and_copy_from,
    scatter_rows,
    sample,
    swiglu_linear,
    linear_residual,
    norm_linear,
    norm_linear_rope,
    norm_linear_into,
    norm_linears_into,
    shared_rounding,
    norm_swiglu_linear,
    paged_attention,
);
