//! Conformance rows of the llama.cpp block formats (`Q4_1`, `Q5_0`, `Q5_1`, the K-quants,
//! `IQ4_NL`, `IQ4_XS`) and of `BF16` weights: on the host backends dequantize bit-exact
//! against gguf-py, quantize byte-exact where gguf-py quantizes, products against the
//! reference. The wgpu and cuda backends run every one (their group decoders):
//! [`kquant_products`] checks their products and dequantization of the super-block formats
//! `Q2_K` … `Q6_K` and `IQ4_XS` against the reference, [`legacy_products`] those of the legacy
//! `Q4_1`, `Q5_0`, `Q5_1` and `IQ4_NL`, [`bf16_products`] those of `BF16`.

use super::common::{assert_close, bf16_bytes, random_blocks, reference, rng, tensor, uniform};
use super::fused::{largest, normed_tolerance};
use super::{
    assert_same_values, compare, f32s, fixture, quantize_matches_gguf_py, quantizes_like_gguf_py,
    TOL,
};
use webtensor::ops::{self, Activations};
use webtensor::{DType, Device, Error, Tensor};

/// Every llama.cpp format webtensor reads, by its fixture name.
const LLAMA_CPP_FORMATS: [(&str, DType); 10] = [
    ("q4_1", DType::Q4_1),
    ("q5_0", DType::Q5_0),
    ("q5_1", DType::Q5_1),
    ("q2_k", DType::Q2_K),
    ("q3_k", DType::Q3_K),
    ("q4_k", DType::Q4_K),
    ("q5_k", DType::Q5_K),
    ("q6_k", DType::Q6_K),
    ("iq4_nl", DType::IQ4_NL),
    ("iq4_xs", DType::IQ4_XS),
];

/// Whether `dev` computes on the host (cpu, reference), where these formats run.
fn on_host(dev: &Device) -> bool {
    matches!(dev.backend_name(), "cpu" | "reference")
}

/// The super-block formats (llama.cpp's K-quant mixes), which wgpu runs.
const SUPER_BLOCK_FORMATS: [DType; 6] = [
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ4_XS,
];

/// The legacy 32-value formats beside `Q8_0` and `Q4_0`, which wgpu runs.
const LEGACY_FORMATS: [DType; 4] = [DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL];

/// Quantize matches gguf-py byte for byte for the formats it quantizes (`Q4_1`, `Q5_0`,
/// `Q5_1`) on every backend. On the host backends dequantize matches gguf-py value for value
/// on random blocks of every format (NaN, ±inf, −0 and subnormal scales included: their values
/// are what GGUF's arithmetic gives), and gguf-py's quantized bytes dequantize to its values;
/// on the GPUs those bytes dequantize within 1e-6 of the largest value (a GPU may fuse
/// `d·q + m` into one rounding; see `group_decoded_products`).
pub fn llama_cpp_formats_gguf_fixtures(dev: &Device) {
    let input = f32s(&fixture("input.f32"));
    let quantized = [
        ("q4_1", DType::Q4_1),
        ("q5_0", DType::Q5_0),
        ("q5_1", DType::Q5_1),
    ];
    // Formats without a quantizer are a typed error, as is a row that is not whole blocks.
    let x = tensor(dev, &input, &[16, 256]);
    let e = ops::quantize(&x, DType::Q4_K).unwrap_err().to_string();
    assert!(e.contains("cannot quantize to q4_k"), "{e}");
    let ragged = Tensor::from_bytes(dev, DType::Q6_K, vec![0u8; 210], [2, 128]);
    assert!(ragged.is_err(), "a Q6_K row of 128 values");
    let ragged = ops::quantize(&tensor(dev, &input[..48], &[48]), DType::Q5_0);
    assert!(ragged.is_err(), "a Q5_0 row of 48 values");
    if !on_host(dev) {
        for (name, format) in quantized {
            let bytes = quantize_matches_gguf_py(dev, &input, name, format);
            let packed = Tensor::from_bytes(dev, format, bytes, [16, 256]).unwrap();
            let got: Vec<f32> = ops::dequantize(&packed).unwrap().to_vec().unwrap();
            let want = f32s(&fixture(&format!("{name}.f32")));
            let what = format!("dequantize {name} on {}", dev.backend_name());
            assert_close(&what, &got, &want, 1e-6);
        }
        return;
    }
    for (name, format) in LLAMA_CPP_FORMATS {
        let bytes = fixture(&format!("{name}.blocks.bin"));
        let values = bytes.len() / format.block_bytes() * format.block_len();
        let packed = Tensor::from_bytes(dev, format, bytes, [1, values]).unwrap();
        let got: Vec<f32> = ops::dequantize(&packed).unwrap().to_vec().unwrap();
        assert_same_values(
            &format!("dequantize {name} blocks on {}", dev.backend_name()),
            &got,
            &f32s(&fixture(&format!("{name}.blocks.f32"))),
        );
    }
    for (name, format) in quantized {
        quantizes_like_gguf_py(dev, &input, name, format);
    }
}

/// Products with weights of each format against the reference (which multiplies the
/// dequantized weights in f64): f32 activations for every format, `Q8_0` and per-row int8
/// activations with the 32-value formats (int8 values with a scale, and for `Q4_1`/`Q5_1` a
/// minimum, per block), `Q8_K` ones with the super-block formats; decode and prefill shapes, the plain product and the fused residual
/// one. Tolerance: matmul's 1e-5·√k.
pub fn llama_cpp_formats_qmatmul(dev: &Device) {
    if !on_host(dev) {
        return;
    }
    let mut r = rng(61);
    for (_, format) in LLAMA_CPP_FORMATS {
        let k_options: &[usize] = if format.block_len() == 32 {
            &[96, 512]
        } else {
            &[256, 768]
        };
        for &k in k_options {
            for (m, n) in [(1, 37), (5, 70)] {
                let w = random_blocks(&mut r, format, n * k / format.block_len(), 0.01);
                let a = uniform(&mut r, m * k, 2.0);
                let residual = uniform(&mut r, m * n, 1.0);
                let modes: &[Activations] = match format {
                    DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL => {
                        &[Activations::F32, Activations::Q8_0, Activations::I8]
                    }
                    _ => &[Activations::F32, Activations::Q8_K],
                };
                for &act in modes {
                    let what = format!("qmatmul {format} {act:?} {m}x{n}x{k}");
                    let tol = TOL * (k as f64).sqrt();
                    let weight =
                        |d: &Device| Tensor::from_bytes(d, format, w.clone(), [n, k]).unwrap();
                    compare(&what, dev, tol, |d| {
                        ops::qmatmul_t(&tensor(d, &a, &[m, k]), &weight(d), act).unwrap()
                    });
                    compare(&format!("linear_residual: {what}"), dev, tol, |d| {
                        let x = tensor(d, &a, &[m, k]);
                        let res = tensor(d, &residual, &[m, n]);
                        ops::linear_residual(&x, &weight(d), &res, act).unwrap()
                    });
                }
                // Activations a format does not pair with are a typed error.
                let d = reference();
                let x = tensor(&d, &a, &[m, k]);
                let wt = Tensor::from_bytes(&d, format, w.clone(), [n, k]).unwrap();
                for act in [Activations::Q8_0, Activations::Q8_K] {
                    if !modes.contains(&act) {
                        let e = ops::qmatmul_t(&x, &wt, act).unwrap_err();
                        assert!(
                            matches!(e, Error::InvalidArgument { .. }),
                            "{format} {act:?}"
                        );
                    }
                }
            }
        }
    }
}

/// The super-block formats (`Q2_K` … `Q6_K`, `IQ4_XS`: llama.cpp's K-quant mixes) as the
/// wgpu backend runs them, against the reference on every backend that reads them: see
/// [`group_decoded_products`]; k a multiple of 256.
pub fn kquant_products(dev: &Device) {
    let shapes = [
        (1, 37, 256),
        (4, 70, 768),
        (3, 6, 2048),
        (5, 37, 512),
        (70, 130, 256),
    ];
    group_decoded_products(dev, &SUPER_BLOCK_FORMATS, &shapes, 65);
}

/// The (m, n, k) of the products of 32-value groups: decode and prefill rows, each k an odd
/// number of groups.
const GROUP_SHAPES: [(usize, usize, usize); 5] = [
    (1, 37, 96),
    (4, 70, 800),
    (3, 6, 2080),
    (5, 37, 224),
    (70, 130, 160),
];

/// The legacy 32-value formats (`Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL`) as the wgpu backend runs
/// them, against the reference on every backend that reads them: see
/// [`group_decoded_products`]. Each k is an odd number of blocks ([`GROUP_SHAPES`]), so every
/// other row of the 22- and 18-byte formats (`Q5_0`, `IQ4_NL`) starts two bytes into a word.
pub fn legacy_products(dev: &Device) {
    group_decoded_products(dev, &LEGACY_FORMATS, &GROUP_SHAPES, 66);
}

/// `BF16` weights as the GPU backends run them (their group decoders, 32 values at a time),
/// against the reference on every backend: see [`group_decoded_products`]; k whole groups of
/// 32, some an odd number of them. A product or dequantization whose rows are not whole
/// groups is a typed error on the GPUs, and the host backends run it.
pub fn bf16_products(dev: &Device) {
    group_decoded_products(dev, &[DType::BF16], &GROUP_SHAPES, 67);
    let mut r = rng(68);
    let (n, k) = (3, 40);
    let w = Tensor::from_bytes(
        dev,
        DType::BF16,
        random_weights(&mut r, DType::BF16, n * k),
        [n, k],
    )
    .unwrap();
    let x = tensor(dev, &uniform(&mut r, 2 * k, 1.0), &[2, k]);
    let product = ops::qmatmul_t(&x, &w, Activations::F32);
    let values = ops::dequantize(&w);
    if matches!(dev.backend_name(), "cpu" | "reference") {
        product.unwrap();
        values.unwrap();
        return;
    }
    for e in [product.unwrap_err(), values.unwrap_err()] {
        assert!(e.to_string().contains("groups of 32 values"), "{e}");
    }
}

/// `blocks` blocks of `format`: random bytes with f16 scales below 0.01 for the block
/// formats; for `BF16` (a value a block), uniform values below 1 in magnitude with their low
/// halves cut (random bytes would hold NaNs and infinities).
fn random_weights(r: &mut rand::rngs::StdRng, format: DType, blocks: usize) -> Vec<u8> {
    if format != DType::BF16 {
        return random_blocks(r, format, blocks, 0.01);
    }
    bf16_bytes(&uniform(r, blocks, 1.0))
}

/// The activations the products of `format` are checked with in [`group_decoded_products`]:
/// f32 for every format, and llama.cpp's rounding for the block formats: `Q8_K` for the
/// super-blocks (which wgpu rounds in `quantize_acts_super`), `Q8_0` for the legacy formats
/// (rounded as for Q4_0).
fn group_activations(format: DType) -> &'static [Activations] {
    if SUPER_BLOCK_FORMATS.contains(&format) {
        &[Activations::F32, Activations::Q8_K]
    } else if format.is_quantized() {
        &[Activations::F32, Activations::Q8_0]
    } else {
        &[Activations::F32]
    }
}

/// Products of `formats` (which wgpu decodes a group at a time, `kquants/decode.wgsl`) against
/// the reference on every backend that reads them, for each (m, n, k) of `shapes` and each of
/// [`group_activations`]: decode rows (m ≤ 4, the `mv` kernel) and prefill rows (on GPUs past
/// 64 rows `mm_tiled`'s tiles), the plain product, `linear_residual`, `swiglu_linear` with the
/// weights uploaded one by one and together (the paired product on GPUs where n is even), and
/// the normed products (which the wgpu backend composes with `Q8_K`, and folds into the
/// rounding with `Q8_0`: the norm folds only into a `Q8_0` or `I8` rounding); then
/// dequantization, and on wgpu the typed refusal of per-row `I8` activations with the legacy
/// formats, which it has no kernel for.
/// Tolerance: matmul's 1e-5·√k (twice that for the SwiGLU products, each output a product of
/// two sums), with int8 activations too: the device rounds them bit-exactly as the reference
/// does (`quantize_acts_super`, `quantize_acts_blocks` and the `mv` kernel's `mv_prepare`),
/// so only the f32 sums differ, as in the `Q8_0` rows of `qmatmul`. A normed product with
/// int8 activations adds `normed_tolerance`'s two roundings to the other neighbour (the device
/// norms in f32 in its own order before it rounds), each moving an output by at most the step
/// times the largest weight. Dequantization: 1e-6 of the largest value (the GPU may fuse
/// `(d·sc)·q − dmin·mn` or `d·q + m` into one rounding).
fn group_decoded_products(
    dev: &Device,
    formats: &[DType],
    shapes: &[(usize, usize, usize)],
    seed: u64,
) {
    let mut r = rng(seed);
    for &format in formats {
        for &(m, n, k) in shapes {
            let blocks = n * k / format.block_len();
            let w = random_weights(&mut r, format, blocks);
            let u = random_weights(&mut r, format, blocks);
            let a = uniform(&mut r, m * k, 2.0);
            let residual = uniform(&mut r, m * n, 1.0);
            let nw = uniform(&mut r, k, 1.0);
            let weight =
                |d: &Device, b: &[u8]| Tensor::from_bytes(d, format, b.to_vec(), [n, k]).unwrap();
            let shape_name = format!("{m}x{n}x{k}");
            for &act in group_activations(format) {
                let what = format!("{format} {act:?} {shape_name}");
                grouped_products(
                    dev,
                    (&what, act, (m, n, k)),
                    [&w, &u],
                    [&a, &residual, &nw],
                    &weight,
                );
            }
            let what = format!("{format} {shape_name}");
            let got: Vec<f32> = ops::dequantize(&weight(dev, &w)).unwrap().to_vec().unwrap();
            let want: Vec<f32> = ops::dequantize(&weight(&reference(), &w))
                .unwrap()
                .to_vec()
                .unwrap();
            assert_close(&format!("dequantize {what}"), &got, &want, 1e-6);
            if dev.backend_name() == "wgpu" && format.block_len() == 32 {
                let x = tensor(dev, &a, &[m, k]);
                let e = ops::qmatmul_t(&x, &weight(dev, &w), Activations::I8).unwrap_err();
                assert!(
                    matches!(e, Error::ActivationsUnsupported { weight, .. } if weight == format),
                    "{what}: per-row i8 activations on wgpu: {e}"
                );
            }
        }
    }
}

/// The rows of [`group_decoded_products`] for one activation mode `act`: weights `w` and `u`
/// (gate and up), activations `a`, a residual and a norm weight, tensors made by `weight`.
fn grouped_products(
    dev: &Device,
    (what, act, (m, n, k)): (&str, Activations, (usize, usize, usize)),
    [w, u]: [&[u8]; 2],
    [a, residual, nw]: [&[f32]; 3],
    weight: &dyn Fn(&Device, &[u8]) -> Tensor,
) {
    let tol = TOL * (k as f64).sqrt();
    compare(&format!("qmatmul {what}"), dev, tol, |d| {
        ops::qmatmul_t(&tensor(d, a, &[m, k]), &weight(d, w), act).unwrap()
    });
    compare(&format!("linear_residual {what}"), dev, tol, |d| {
        let res = tensor(d, residual, &[m, n]);
        ops::linear_residual(&tensor(d, a, &[m, k]), &weight(d, w), &res, act).unwrap()
    });
    compare(&format!("swiglu_linear {what}"), dev, 2.0 * tol, |d| {
        let x = tensor(d, a, &[m, k]);
        ops::swiglu_linear(&x, &weight(d, w), &weight(d, u), act).unwrap()
    });
    compare(
        &format!("swiglu_linear grouped {what}"),
        dev,
        2.0 * tol,
        |d| {
            let shape = webtensor::Shape::from([n, k]);
            let parts = vec![
                (weight(d, w).dtype(), w.to_vec(), shape.clone()),
                (weight(d, u).dtype(), u.to_vec(), shape),
            ];
            let [gate, up]: [Tensor; 2] = Tensor::from_bytes_group(d, parts)
                .unwrap()
                .try_into()
                .unwrap();
            ops::swiglu_linear(&tensor(d, a, &[m, k]), &gate, &up, act).unwrap()
        },
    );
    let normed_linear = |d: &Device| {
        let norm = ops::RmsNormParams {
            weight: &tensor(d, nw, &[k]),
            eps: 1e-5,
        };
        let product = ops::NormProduct {
            weight: &weight(d, w),
            activations: act,
            rope: None,
        };
        let x = tensor(d, a, &[m, k]);
        ops::rms_norm_linears(&x, norm, &[product])
            .unwrap()
            .remove(0)
    };
    let refd = reference();
    let want: Vec<f32> = normed_linear(&refd).to_vec().unwrap();
    let normed: Vec<f32> =
        ops::rms_norm(&tensor(&refd, a, &[m, k]), &tensor(&refd, nw, &[k]), 1e-5)
            .unwrap()
            .to_vec()
            .unwrap();
    let dequantized: Vec<f32> = ops::dequantize(&weight(&refd, w))
        .unwrap()
        .to_vec()
        .unwrap();
    let tol_normed = normed_tolerance(tol, act, &normed, largest(&dequantized), largest(&want));
    compare(
        &format!("rms_norm_linear {what}"),
        dev,
        tol_normed,
        normed_linear,
    );
    // A rounding to the other neighbour moves a gate or up sum by the step times the largest
    // weight, and a SwiGLU output by up to about 2.2 times the largest sum that much
    // (`norm_swiglu_linear` in fused.rs).
    let h = tensor(&refd, &normed, &[m, k]);
    let sums = [w, u].map(|v| {
        let y = ops::qmatmul_t(&h, &weight(&refd, v), act).unwrap();
        largest(&y.to_vec().unwrap())
    });
    let run = |d: &Device| {
        let norm = ops::RmsNormParams {
            weight: &tensor(d, nw, &[k]),
            eps: 1e-5,
        };
        let x = tensor(d, a, &[m, k]);
        ops::rms_norm_swiglu_linear(&x, norm, &weight(d, w), &weight(d, u), act).unwrap()
    };
    let want: Vec<f32> = run(&refd).to_vec().unwrap();
    let reach = 2.2 * sums[0].max(sums[1]) * largest(&dequantized);
    let tol_swiglu = normed_tolerance(2.0 * tol, act, &normed, reach, largest(&want));
    compare(
        &format!("rms_norm_swiglu_linear {what}"),
        dev,
        tol_swiglu,
        run,
    );
}
