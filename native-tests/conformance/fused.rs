//! Conformance rows of the fused decode ops (`swiglu_linear`, `linear_residual`, the products
//! with an RMS norm folded in, `paged_attention`): each on the device under test against the
//! reference backend's kernel, and that kernel against the unfused ops it stands for (the
//! composition a backend without the kernel runs, forced on the reference by disabling the op
//! there).

use super::common::{assert_close, reference, rng, tensor, uniform};
use super::{compare, packed_weight, TOL};
use rand::rngs::StdRng;
use webtensor::ops::{self, Activations, RopeLayout};
use webtensor::{BackendKind, DType, Device, OpKind, Shape, Tensor};

/// The reference backend with `op` disabled: the fused op runs as its composition there.
fn composed(op: OpKind) -> Device {
    Device::builder()
        .priority(vec![BackendKind::Reference])
        .disable_op(BackendKind::Reference, op)
        .build()
        .unwrap()
}

/// A weight of `format` on `d`; f32 stays f32.
fn weight(d: &Device, w: &[f32], n: usize, k: usize, format: DType) -> Tensor {
    if format == DType::F32 {
        tensor(d, w, &[n, k])
    } else {
        packed_weight(d, w, n, k, format)
    }
}

/// The gate and up weights `[n, k]` uploaded together (`Tensor::from_bytes_group`), as the
/// engine loads a layer's: the wgpu backend may then multiply both in one dispatch.
fn grouped_weights(
    d: &Device,
    (g, u): (&[f32], &[f32]),
    n: usize,
    k: usize,
    format: DType,
) -> [Tensor; 2] {
    let bytes = |w: &[f32]| match format {
        DType::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        _ => ops::quantize(&tensor(&reference(), w, &[n, k]), format)
            .unwrap()
            .to_bytes()
            .unwrap(),
    };
    let parts = vec![
        (format, bytes(g), Shape::from([n, k])),
        (format, bytes(u), Shape::from([n, k])),
    ];
    Tensor::from_bytes_group(d, parts)
        .unwrap()
        .try_into()
        .unwrap()
}

/// Two f32 tensors of `shape` allocated together (`Tensor::from_bytes_group`), as the engine
/// allocates a layer's key and value pools: on wgpu's GPU shapes views of one buffer.
fn grouped_pools(d: &Device, data: [&[f32]; 2], shape: [usize; 2]) -> [Tensor; 2] {
    let part = |v: &[f32]| {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        (DType::F32, bytes, Shape::from(shape))
    };
    Tensor::from_bytes_group(d, data.map(part).to_vec())
        .unwrap()
        .try_into()
        .unwrap()
}

/// Weight formats with the activation modes the engine pairs with each.
fn formats() -> Vec<(DType, Activations)> {
    let mut out = vec![
        (DType::F32, Activations::F32),
        (DType::F16, Activations::F32),
    ];
    for f in [
        DType::Q8_0,
        DType::Q4_0,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::TernaryPlanes,
    ] {
        out.extend([Activations::F32, Activations::Q8_0, Activations::I8].map(|a| (f, a)));
    }
    out
}

/// Asserts the fused op on the device, on the reference and composed from unfused ops agree.
fn three_ways(what: &str, dev: &Device, op: OpKind, tol: f64, f: impl Fn(&Device) -> Tensor) {
    compare(what, dev, tol, &f);
    let fused: Vec<f32> = f(&reference()).to_vec().unwrap();
    let parts: Vec<f32> = f(&composed(op)).to_vec().unwrap();
    assert_close(
        &format!("{what}: reference kernel vs unfused ops"),
        &fused,
        &parts,
        tol,
    );
}

const LINEAR_SHAPES: [(usize, usize, usize); 5] = [
    (1, 5, 256),
    (3, 33, 512),
    (1, 300, 512),
    (4, 13, 1280),
    // Past wgpu's in-kernel rounding of int8 activations (m > 4, k > 2048): a separate
    // rounding dispatch, then the product with its epilogue.
    (6, 20, 2560),
];

/// gate·up·SiLU in one op, every weight dtype and activation mode, decode and prefill rows,
/// the weights uploaded one by one and together (the wgpu backend's paired product on GPUs
/// where n is even, each weight bound as its range of the group otherwise).
/// Tolerance: twice the product's 1e-5·√k, each output being a product of two sums.
pub fn swiglu_linear(dev: &Device) {
    let mut r = rng(61);
    for (m, n, k) in LINEAR_SHAPES {
        let x = uniform(&mut r, m * k, 2.0);
        let (g, u) = (uniform(&mut r, n * k, 1.0), uniform(&mut r, n * k, 1.0));
        for (format, act) in formats() {
            let what = format!("swiglu_linear {format} {act:?} {m}x{n}x{k}");
            three_ways(
                &what,
                dev,
                OpKind::SwigluLinear,
                2.0 * TOL * (k as f64).sqrt(),
                |d| {
                    ops::swiglu_linear(
                        &tensor(d, &x, &[m, k]),
                        &weight(d, &g, n, k, format),
                        &weight(d, &u, n, k, format),
                        act,
                    )
                    .unwrap()
                },
            );
            compare(
                &format!("{what}, gate and up uploaded together"),
                dev,
                2.0 * TOL * (k as f64).sqrt(),
                |d| {
                    let [gate, up] = grouped_weights(d, (&g, &u), n, k, format);
                    ops::swiglu_linear(&tensor(d, &x, &[m, k]), &gate, &up, act).unwrap()
                },
            );
        }
    }
}

/// A product with the residual added, every weight dtype and activation mode.
/// Tolerance: the product's 1e-5·√k.
pub fn linear_residual(dev: &Device) {
    let mut r = rng(62);
    for (m, n, k) in LINEAR_SHAPES {
        let x = uniform(&mut r, m * k, 2.0);
        let w = uniform(&mut r, n * k, 1.0);
        let res = uniform(&mut r, m * n, 3.0);
        for (format, act) in formats() {
            let what = format!("linear_residual {format} {act:?} {m}x{n}x{k}");
            three_ways(
                &what,
                dev,
                OpKind::LinearResidual,
                TOL * (k as f64).sqrt(),
                |d| {
                    ops::linear_residual(
                        &tensor(d, &x, &[m, k]),
                        &weight(d, &w, n, k, format),
                        &tensor(d, &res, &[m, n]),
                        act,
                    )
                    .unwrap()
                },
            );
        }
    }
}

/// Shapes of the normed products: [`LINEAR_SHAPES`] and the longest row wgpu's decode kernel
/// norms and rounds itself (m · k = 8192).
const NORM_SHAPES: [(usize, usize, usize); 6] = [
    LINEAR_SHAPES[0],
    LINEAR_SHAPES[1],
    LINEAR_SHAPES[2],
    LINEAR_SHAPES[3],
    LINEAR_SHAPES[4],
    (1, 40, 8192),
];

/// A large eps against the rows' mean square (about 4/3), so an eps handled wrongly shows.
const NORM_EPS: f32 = 0.25;

/// The tolerance of a product of normed rows, relative to the largest output `scale`: `tol`
/// plus, for int8 activations, two values of the normed rows rounded to the neighbouring
/// integer, each changing an output by up to its group's step (largest normed value / 127)
/// times `reach` (the largest weight, or what one such change can move a SwiGLU output by).
/// A device norms in f32 in its own order, so a value within an ulp of a rounding boundary
/// may round the other way than on the reference.
pub(super) fn normed_tolerance(
    tol: f64,
    act: Activations,
    normed: &[f32],
    reach: f64,
    scale: f64,
) -> f64 {
    if act == Activations::F32 {
        return tol;
    }
    let step = normed.iter().fold(0f64, |m, v| m.max(v.abs() as f64)) / 127.0;
    tol + 2.0 * step * reach / scale.max(1.0)
}

/// Rows `x` f32 `[m, k]` to RMS-norm with weight `nw` `[k]`, and the normed rows on the
/// reference (for [`normed_tolerance`]).
struct NormedRows {
    x: Vec<f32>,
    nw: Vec<f32>,
    normed: Vec<f32>,
}

fn normed_rows(r: &mut StdRng, m: usize, k: usize) -> NormedRows {
    let x = uniform(r, m * k, 2.0);
    let nw = uniform(r, k, 1.5);
    let refd = reference();
    let normed = ops::rms_norm(
        &tensor(&refd, &x, &[m, k]),
        &tensor(&refd, &nw, &[k]),
        NORM_EPS,
    )
    .unwrap()
    .to_vec()
    .unwrap();
    NormedRows { x, nw, normed }
}

/// The largest magnitude of `values`.
pub(super) fn largest(values: &[f32]) -> f64 {
    values.iter().fold(0f64, |m, v| m.max(v.abs() as f64))
}

/// Products of RMS-normed rows (`rms_norm_linears`, one weight at a time here), every weight
/// dtype and activation mode, decode rows the wgpu kernel folds the norm into and prefill rows
/// it composes. Tolerance: the product's 1e-5·√k, plus rounding flips of int8 activations.
pub fn norm_linear(dev: &Device) {
    let mut r = rng(63);
    for (m, n, k) in NORM_SHAPES {
        let NormedRows { x, nw, normed } = normed_rows(&mut r, m, k);
        let w = uniform(&mut r, n * k, 1.0);
        let refd = reference();
        for (format, act) in formats() {
            let what = format!("rms_norm_linear {format} {act:?} {m}x{n}x{k}");
            let run = |d: &Device| {
                let norm = ops::RmsNormParams {
                    weight: &tensor(d, &nw, &[k]),
                    eps: NORM_EPS,
                };
                let product = ops::NormProduct {
                    weight: &weight(d, &w, n, k, format),
                    activations: act,
                    rope: None,
                };
                let mut out =
                    ops::rms_norm_linears(&tensor(d, &x, &[m, k]), norm, &[product]).unwrap();
                out.remove(0)
            };
            let want: Vec<f32> = run(&refd).to_vec().unwrap();
            let tol = normed_tolerance(TOL * (k as f64).sqrt(), act, &normed, 1.0, largest(&want));
            three_ways(&what, dev, OpKind::NormLinear, tol, run);
        }
    }
}

/// Normed products of the same rows and norm weight one after another, as a decode layer's q,
/// k and v are (on CPU adapters the wgpu backend rounds such rows once for all of them), then
/// after the rows are written in place, then with another norm weight: each product agrees
/// with the reference on the data it was given. Tolerance: as [`norm_linear`].
pub fn shared_rounding(dev: &Device) {
    let mut r = rng(67);
    let (m, n, k) = (1, 64, 256);
    let first = normed_rows(&mut r, m, k);
    let second = normed_rows(&mut r, m, k);
    let weights: Vec<Vec<f32>> = (0..3).map(|_| uniform(&mut r, n * k, 1.0)).collect();
    let (format, act) = (DType::Q4_0, Activations::Q8_0);
    let refd = reference();
    let product = |d: &Device, rows: &Tensor, nw: &Tensor, w: &[f32]| -> Vec<f32> {
        let norm = ops::RmsNormParams {
            weight: nw,
            eps: NORM_EPS,
        };
        let product = ops::NormProduct {
            weight: &weight(d, w, n, k, format),
            activations: act,
            rope: None,
        };
        let mut out = ops::rms_norm_linears(rows, norm, &[product]).unwrap();
        out.remove(0).to_vec().unwrap()
    };
    let mut rows = tensor(dev, &first.x, &[m, k]);
    let other_rows = tensor(dev, &first.x, &[m, k]);
    let norm_weights = [tensor(dev, &first.nw, &[k]), tensor(dev, &second.nw, &[k])];
    // (which rows tensor, its values then, which norm weight, which product weight): the same
    // rows and norm twice; the rows written in place; other rows, same norm; other norm.
    let steps = [
        (0, &first.x, 0, 0),
        (0, &first.x, 0, 1),
        (0, &second.x, 0, 2),
        (1, &first.x, 0, 0),
        (1, &first.x, 1, 1),
    ];
    for (i, &(which, values, norm, w)) in steps.iter().enumerate() {
        if i == 2 {
            let slot = tensor(dev, &[0u32], &[1]);
            ops::scatter_rows(&mut rows, &slot, &tensor(dev, &second.x, &[m, k])).unwrap();
        }
        let nw = [&first.nw, &second.nw][norm];
        let want = product(
            &refd,
            &tensor(&refd, values, &[m, k]),
            &tensor(&refd, nw, &[k]),
            &weights[w],
        );
        let got = product(
            dev,
            [&rows, &other_rows][which],
            &norm_weights[norm],
            &weights[w],
        );
        let normed = ops::rms_norm(
            &tensor(&refd, values, &[m, k]),
            &tensor(&refd, nw, &[k]),
            NORM_EPS,
        )
        .unwrap()
        .to_vec()
        .unwrap();
        let tol = normed_tolerance(TOL * (k as f64).sqrt(), act, &normed, 1.0, largest(&want));
        assert_close(
            &format!(
                "normed product {i} of one row set on {}",
                dev.backend_name()
            ),
            &got,
            &want,
            tol,
        );
    }
}

/// Products of RMS-normed rows rotated as q and k are (`rms_norm_linears` with a rope), both
/// pairings, several heads, rows at scattered positions: decode rows wgpu folds the norm and
/// the rotation of interleaved pairs into, and rows it composes. Tolerance: as [`norm_linear`]
/// (the rotation's own error is under 1e-7 of the values).
pub fn norm_linear_rope(dev: &Device) {
    let mut r = rng(65);
    // (m, n, k, head_dim)
    for (m, n, k, hd) in [
        (1, 64, 256, 16),
        (3, 96, 512, 32),
        (4, 48, 1280, 8),
        (6, 32, 2560, 16),
        (1, 40, 8192, 8),
    ] {
        let NormedRows { x, nw, normed } = normed_rows(&mut r, m, k);
        let w = uniform(&mut r, n * k, 1.0);
        let positions: Vec<u32> = [7, 1000, 3, 42, 65_000, 0][..m].to_vec();
        let inv_freq = ops::rope_inv_freq(10_000.0, hd);
        let refd = reference();
        for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            for (format, act) in [
                (DType::Q4_0, Activations::Q8_0),
                (DType::Q8_0, Activations::Q8_0),
                (DType::TQ2_0, Activations::I8),
                (DType::F16, Activations::F32),
            ] {
                let what =
                    format!("rms_norm_linear + rope {layout:?} {format} {act:?} {m}x{n}x{k}");
                let run = |d: &Device| {
                    let norm = ops::RmsNormParams {
                        weight: &tensor(d, &nw, &[k]),
                        eps: NORM_EPS,
                    };
                    let rope = ops::Rotary {
                        positions: &tensor(d, &positions, &[m]),
                        inv_freq: &tensor(d, &inv_freq, &[hd / 2]),
                        head_dim: hd,
                        layout,
                    };
                    let product = ops::NormProduct {
                        weight: &weight(d, &w, n, k, format),
                        activations: act,
                        rope: Some(rope),
                    };
                    let x = tensor(d, &x, &[m, k]);
                    ops::rms_norm_linears(&x, norm, &[product])
                        .unwrap()
                        .remove(0)
                };
                let want: Vec<f32> = run(&refd).to_vec().unwrap();
                let tol =
                    normed_tolerance(TOL * (k as f64).sqrt(), act, &normed, 1.0, largest(&want));
                three_ways(&what, dev, OpKind::NormLinear, tol, run);
            }
        }
    }
}

/// Products of RMS-normed rows stored in place into rows of a KV pool, heads first
/// (`rms_norm_linear_into`), with and without a rope: the pool afterwards, the rows not
/// written included. Tolerance: as [`norm_linear`].
pub fn norm_linear_into(dev: &Device) {
    let mut r = rng(66);
    for (m, n, k, hd) in [
        (1, 64, 256, 16),
        (3, 96, 512, 32),
        (4, 48, 1280, 8),
        (6, 32, 2560, 16),
    ] {
        let NormedRows { x, nw, normed } = normed_rows(&mut r, m, k);
        let w = uniform(&mut r, n * k, 1.0);
        let count = m * n / hd;
        let pool_rows = count + 7;
        let pool = uniform(&mut r, pool_rows * hd, 1.0);
        // Distinct slots in a scattered order.
        let slots: Vec<u32> = (0..count)
            .map(|i| ((i * 5 + 3) % pool_rows) as u32)
            .collect();
        let positions: Vec<u32> = [9, 2000, 4, 77, 31_000, 1][..m].to_vec();
        let inv_freq = ops::rope_inv_freq(10_000.0, hd);
        let refd = reference();
        for layout in [
            None,
            Some(RopeLayout::Interleaved),
            Some(RopeLayout::HalfSplit),
        ] {
            for (format, act) in [
                (DType::Q4_0, Activations::Q8_0),
                (DType::Q8_0, Activations::I8),
                (DType::F32, Activations::F32),
            ] {
                let what = format!("rms_norm_linear_into {layout:?} {format} {act:?} {m}x{n}x{k}");
                let run = |d: &Device| {
                    let norm = ops::RmsNormParams {
                        weight: &tensor(d, &nw, &[k]),
                        eps: NORM_EPS,
                    };
                    let (pos, freq) =
                        (tensor(d, &positions, &[m]), tensor(d, &inv_freq, &[hd / 2]));
                    let rope = layout.map(|layout| ops::Rotary {
                        positions: &pos,
                        inv_freq: &freq,
                        head_dim: hd,
                        layout,
                    });
                    let product = ops::NormProduct {
                        weight: &weight(d, &w, n, k, format),
                        activations: act,
                        rope,
                    };
                    let mut target = tensor(d, &pool, &[pool_rows, hd]);
                    let slots = tensor(d, &slots, &[count]);
                    let x = tensor(d, &x, &[m, k]);
                    ops::rms_norm_linear_into(&mut target, &slots, &x, norm, product).unwrap();
                    target
                };
                let want: Vec<f32> = run(&refd).to_vec().unwrap();
                let tol =
                    normed_tolerance(TOL * (k as f64).sqrt(), act, &normed, 1.0, largest(&want));
                three_ways(&what, dev, OpKind::NormLinearInto, tol, run);
            }
        }
    }
}

/// A layer's key and value products stored in place into its two pools in one op
/// (`rms_norm_linears_into`), the key rows rotated (or not, with `None`): both pools
/// afterwards, the rows not written included. Pools and weights each allocated together
/// (`Tensor::from_bytes_group`, as the engine allocates them: the wgpu backend's GPU shapes
/// store both with one dispatch there) and apart (two stores). Tolerance: as [`norm_linear`].
pub fn norm_linears_into(dev: &Device) {
    let mut r = rng(67);
    for (m, n, k, hd) in [
        (1, 64, 256, 16),
        (1, 96, 512, 32),
        (3, 48, 1280, 8),
        (6, 32, 2560, 16),
    ] {
        let NormedRows { x, nw, normed } = normed_rows(&mut r, m, k);
        let (wk, wv) = (uniform(&mut r, n * k, 1.0), uniform(&mut r, n * k, 1.0));
        let count = m * n / hd;
        let pool_rows = count + 5;
        let pools = [
            uniform(&mut r, pool_rows * hd, 1.0),
            uniform(&mut r, pool_rows * hd, 1.0),
        ];
        let slots: Vec<u32> = (0..count)
            .map(|i| ((i * 7 + 2) % pool_rows) as u32)
            .collect();
        let positions: Vec<u32> = [5, 1500, 8, 90, 20_000, 3][..m].to_vec();
        let inv_freq = ops::rope_inv_freq(10_000.0, hd);
        let refd = reference();
        for layout in [
            None,
            Some(RopeLayout::Interleaved),
            Some(RopeLayout::HalfSplit),
        ] {
            for (format, act) in [
                (DType::Q4_0, Activations::Q8_0),
                (DType::Q8_0, Activations::I8),
                (DType::F32, Activations::F32),
            ] {
                for together in [true, false] {
                    let what = format!(
                        "rms_norm_linears_into {layout:?} {format} {act:?} {m}x{n}x{k}, \
                         allocated together: {together}"
                    );
                    let run = |d: &Device| {
                        let norm = ops::RmsNormParams {
                            weight: &tensor(d, &nw, &[k]),
                            eps: NORM_EPS,
                        };
                        let (pos, freq) =
                            (tensor(d, &positions, &[m]), tensor(d, &inv_freq, &[hd / 2]));
                        let rope = layout.map(|layout| ops::Rotary {
                            positions: &pos,
                            inv_freq: &freq,
                            head_dim: hd,
                            layout,
                        });
                        let ([wk, wv], [mut keys, mut values]) = if together {
                            let [keys, values] = &pools;
                            (
                                grouped_weights(d, (&wk, &wv), n, k, format),
                                grouped_pools(d, [keys, values], [pool_rows, hd]),
                            )
                        } else {
                            (
                                [&wk, &wv].map(|w| weight(d, w, n, k, format)),
                                pools.each_ref().map(|p| tensor(d, p, &[pool_rows, hd])),
                            )
                        };
                        let products =
                            [(&wk, rope), (&wv, None)].map(|(weight, rope)| ops::NormProduct {
                                weight,
                                activations: act,
                                rope,
                            });
                        let slots = tensor(d, &slots, &[count]);
                        let x = tensor(d, &x, &[m, k]);
                        let pools = (&mut keys, &mut values);
                        ops::rms_norm_linears_into(pools, &slots, &x, norm, products).unwrap();
                        let both = [keys.to_vec::<f32>().unwrap(), values.to_vec().unwrap()];
                        tensor(&reference(), &both.concat(), &[2 * pool_rows, hd])
                    };
                    let want: Vec<f32> = run(&refd).to_vec().unwrap();
                    let tol = normed_tolerance(
                        TOL * (k as f64).sqrt(),
                        act,
                        &normed,
                        1.0,
                        largest(&want),
                    );
                    three_ways(&what, dev, OpKind::NormLinearInto, tol, run);
                }
            }
        }
    }
}

/// `swiglu_linear` of RMS-normed rows (`rms_norm_swiglu_linear`), as [`norm_linear`].
/// Tolerance: [`swiglu_linear`]'s, plus rounding flips of int8 activations, each moving an
/// output `silu(g)·u` by up to its step times `|u|·max silu' + |silu(g)|` per unit of g or u
/// (max silu' < 1.1).
pub fn norm_swiglu_linear(dev: &Device) {
    let mut r = rng(64);
    for (m, n, k) in NORM_SHAPES {
        let NormedRows { x, nw, normed } = normed_rows(&mut r, m, k);
        let (g, u) = (uniform(&mut r, n * k, 1.0), uniform(&mut r, n * k, 1.0));
        let refd = reference();
        let h = tensor(&refd, &normed, &[m, k]);
        for (format, act) in formats() {
            let what = format!("rms_norm_swiglu_linear {format} {act:?} {m}x{n}x{k}");
            let run = |d: &Device| {
                let norm = ops::RmsNormParams {
                    weight: &tensor(d, &nw, &[k]),
                    eps: NORM_EPS,
                };
                ops::rms_norm_swiglu_linear(
                    &tensor(d, &x, &[m, k]),
                    norm,
                    &weight(d, &g, n, k, format),
                    &weight(d, &u, n, k, format),
                    act,
                )
                .unwrap()
            };
            let want: Vec<f32> = run(&refd).to_vec().unwrap();
            let products = [&g, &u].map(|v| {
                let w = weight(&refd, v, n, k, format);
                let y = match act {
                    Activations::F32 => ops::matmul_t(&h, &w),
                    a => ops::qmatmul_t(&h, &w, a),
                };
                largest(&y.unwrap().to_vec().unwrap())
            });
            let reach = 2.2 * products[0].max(products[1]);
            let tol = normed_tolerance(
                2.0 * TOL * (k as f64).sqrt(),
                act,
                &normed,
                reach,
                largest(&want),
            );
            three_ways(&what, dev, OpKind::SwigluLinear, tol, run);
        }
    }
}

/// One paged-attention case: the device against the reference kernel and the composition.
/// `pool` holds the keys and values `[pool_rows, hd]`, `rows` the sequence's pool rows
/// `[kv, n]`. The row table gets `unread` columns more than the keys, of rows past the pool
/// (NaN if read), as a decode step's table of the cache's capacity has.
/// Tolerance: the product's 1e-5·√n.
#[allow(clippy::too_many_arguments)]
fn attention_case(
    dev: &Device,
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    (rows, unread): (&[u32], usize),
    (t, heads, kv, hd, n): (usize, usize, usize, usize, usize),
    scale: f32,
    (window, softcap): (Option<usize>, Option<f32>),
) {
    let pool_rows = keys.len() / hd;
    let columns = n + unread;
    let table: Vec<u32> = rows
        .chunks(n)
        .flat_map(|head| {
            let unread = (0..columns - n).map(|j| (pool_rows + j) as u32);
            head.iter().copied().chain(unread)
        })
        .collect();
    let what = format!(
        "paged_attention {heads}/{kv} heads hd={hd} t={t} n={n} of {columns} columns {window:?} \
         softcap {softcap:?}"
    );
    three_ways(
        &what,
        dev,
        OpKind::PagedAttention,
        TOL * (n as f64).sqrt(),
        |d| {
            let pool = |v: &[f32]| tensor(d, v, &[pool_rows, hd]);
            ops::paged_attention(
                &tensor(d, q, &[t, heads * hd]),
                (&pool(keys), &pool(values)),
                (&tensor(d, &table, &[kv, columns]), n),
                heads,
                scale,
                (window, softcap),
            )
            .unwrap()
        },
    );
    // The pools as views of one buffer (`Tensor::from_bytes_group`, as the engine allocates a
    // layer's), values after keys or, for odd n, before them: wgpu binds them as one range.
    compare(
        &format!("{what}, pools allocated together"),
        dev,
        TOL * (n as f64).sqrt(),
        |d| {
            let swapped = n % 2 == 1;
            let order = if swapped {
                [values, keys]
            } else {
                [keys, values]
            };
            let [first, second] = grouped_pools(d, order, [pool_rows, hd]);
            let (k, v) = match swapped {
                true => (&second, &first),
                false => (&first, &second),
            };
            ops::paged_attention(
                &tensor(d, q, &[t, heads * hd]),
                (k, v),
                (&tensor(d, &table, &[kv, columns]), n),
                heads,
                scale,
                (window, softcap),
            )
            .unwrap()
        },
    );
}

/// Attention over a pool whose sequence rows are scattered (a shuffled slot list): GQA group
/// sizes 1, 2 and 3, one and several new queries, with and without sliding windows shorter
/// and longer than the sequence; then long sequences (several of the wgpu kernel's 64-key
/// chunks, its online softmax rescaling them) and heads wider than its 128-wide slice and not
/// a multiple of 4.
pub fn paged_attention(dev: &Device) {
    let mut r = rng(63);
    let (slots, hd) = (48, 16);
    for (heads, kv) in [(4, 2), (3, 1), (2, 2)] {
        let pool_rows = kv * slots;
        let keys = uniform(&mut r, pool_rows * hd, 1.0);
        let values = uniform(&mut r, pool_rows * hd, 1.0);
        for (t, n) in [(1, 1), (1, 29), (3, 7), (5, 40), (7, 7)] {
            // The sequence's slots, scattered (7 is prime to 48) and distinct; rows head-major.
            let seq: Vec<u32> = (0..n).map(|j| ((j * 7 + 5) % slots) as u32).collect();
            let rows: Vec<u32> = (0..kv)
                .flat_map(|g| seq.iter().map(move |&s| (g * slots) as u32 + s))
                .collect();
            let q = uniform(&mut r, t * heads * hd, 2.0);
            // Soft-capping (Gemma 2) with a cap the scores pass, with and without a window.
            let masks = [None, Some(1), Some(4), Some(64)]
                .map(|w| (w, None))
                .into_iter()
                .chain([(None, Some(0.3)), (Some(4), Some(0.3))]);
            for mask in masks {
                let sizes = (t, heads, kv, hd, n);
                let table = (&rows[..], 3 * (n % 2));
                attention_case(dev, &q, (&keys, &values), table, sizes, 0.25, mask);
            }
        }
    }
    // The last: more keys than one lane may walk on lavapipe (kernels.rs, "Loop budget").
    for (heads, kv, hd, t, n) in [(4, 2, 72, 2, 150), (2, 1, 262, 1, 70), (2, 1, 64, 1, 4100)] {
        // 13 is prime to each pool's slot count (161, 81 and 4111): distinct rows.
        let slots = n + 11;
        let keys = uniform(&mut r, kv * slots * hd, 1.0);
        let values = uniform(&mut r, kv * slots * hd, 1.0);
        let rows: Vec<u32> = (0..kv * n)
            .map(|i| ((i / n) * slots + (i % n * 13 + 3) % slots) as u32)
            .collect();
        let q = uniform(&mut r, t * heads * hd, 0.5);
        for window in [None, Some(100)] {
            let sizes = (t, heads, kv, hd, n);
            let table = (&rows[..], 3 * (n % 2));
            attention_case(
                dev,
                &q,
                (&keys, &values),
                table,
                sizes,
                0.125,
                (window, None),
            );
        }
    }
    paged_attention_split(dev, &mut r);
}

/// Attention split over its keys (wgpu's flash decoding: chunks of keys merged by a second
/// kernel, the count of chunks chosen from the table's columns, so that a replayed decode step
/// can read more keys with the same split). Tables far wider than the keys (most chunks short
/// or empty), long sequences, several queries and windows; groups of 1 to 8 query heads per
/// key/value head (CPU adapters take up to four of a group's heads per lane: 5 as 3 + 2, 7 as
/// 4 + 3, 8 as 4 + 4); heads narrower and wider than a CPU adapter's lane of 64 dimensions and
/// not a multiple of 4.
fn paged_attention_split(dev: &Device, r: &mut StdRng) {
    // (heads, kv, hd, t, n, unread columns, window)
    let cases = [
        (8, 2, 64, 1, 300, 700, None),
        (8, 2, 64, 1, 300, 700, Some(90)),
        (5, 1, 64, 4, 600, 0, None),
        (5, 1, 64, 4, 600, 0, Some(513)),
        (7, 1, 36, 3, 520, 61, None),
        (6, 2, 40, 1, 9, 1000, None),
        (3, 3, 64, 2, 1100, 0, Some(700)),
        (8, 1, 98, 2, 1100, 3, None),
    ];
    for (heads, kv, hd, t, n, unread, window) in cases {
        let slots = n + 5;
        let keys = uniform(r, kv * slots * hd, 1.0);
        let values = uniform(r, kv * slots * hd, 1.0);
        // A step prime to the slot count: distinct rows, scattered.
        let step = [7, 11, 13].into_iter().find(|s| slots % s != 0).unwrap();
        let rows: Vec<u32> = (0..kv * n)
            .map(|i| ((i / n) * slots + (i % n * step + 2) % slots) as u32)
            .collect();
        let q = uniform(r, t * heads * hd, 0.5);
        let sizes = (t, heads, kv, hd, n);
        let table = (&rows[..], unread);
        attention_case(
            dev,
            &q,
            (&keys, &values),
            table,
            sizes,
            0.125,
            (window, None),
        );
    }
}
