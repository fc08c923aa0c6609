//! The wgpu backend's per-kernel GPU timestamp profiler (the option `wgpu.profile`): after a
//! few known ops, the profile names each of their kernels with its dispatch count and a
//! positive GPU time, and each submit's span covers its kernels. On a CPU adapter it also
//! shows that a Q4_0 decode product read its weights' texel copy.

mod common;

use common::{assert_close, reference, rng, tensor, uniform};
use webtensor::backend::{BackendOptions, DeviceClass};
use webtensor::ops::{self, Activations};
use webtensor::DType;

#[test]
fn profiler_times_each_kernel() {
    let mut options = BackendOptions::default();
    options.wgpu.profile = true;
    let Some(gpu) = common::wgpu_with(options) else {
        return;
    };
    let info = gpu.info();
    if !info.features.iter().any(|f| f == "timestamp-query") {
        // The profiler must say why it is off, and measure nothing.
        assert!(
            info.profiler.starts_with("unavailable"),
            "{}",
            info.profiler
        );
        assert!(gpu.kernel_profile().is_none());
        eprintln!("skipping: {}", info.profiler);
        return;
    }
    assert!(info.profiler.starts_with("per-kernel"), "{}", info.profiler);
    // The self-check ran kernels already: measure from here.
    let before = gpu.kernel_profile().expect("profiling is on");

    let mut r = rng(7);
    let (m, k, n) = (1, 256, 64);
    let a = uniform(&mut r, 1000, 1.0);
    let b = uniform(&mut r, 1000, 1.0);
    let x = tensor(&gpu, &a, &[1000]);
    let y = tensor(&gpu, &b, &[1000]);
    // Three adds and two products, recorded into one batch and submitted by the download.
    let s = ops::add(&x, &y).unwrap();
    let s = ops::add(&s, &y).unwrap();
    let p = ops::mul(&s, &x).unwrap();
    let p = ops::mul(&p, &y).unwrap();
    let out = ops::add(&p, &x).unwrap();
    let want: Vec<f32> = (0..1000)
        .map(|i| ((a[i] + b[i] + b[i]) * a[i]) * b[i] + a[i])
        .collect();
    assert_close("elementwise chain", &out.to_vec().unwrap(), &want, 1e-5);

    // A packed product: its kernel is labelled with the weight format. A second submit.
    let rf = reference();
    let w = uniform(&mut r, n * k, 1.0);
    let packed = ops::quantize(&tensor(&rf, &w, &[n, k]), DType::Q4_0).unwrap();
    let act = uniform(&mut r, m * k, 1.0);
    let got = ops::qmatmul_t(
        &tensor(&gpu, &act, &[m, k]),
        &packed.to_device(&gpu).unwrap(),
        Activations::F32,
    )
    .unwrap();
    let want = ops::qmatmul_t(&tensor(&rf, &act, &[m, k]), &packed, Activations::F32).unwrap();
    assert_close(
        "q4_0 product",
        &got.to_vec().unwrap(),
        &want.to_vec().unwrap(),
        1e-3,
    );

    // A decode product with int8 activations. On a CPU adapter the backend keeps a texel copy
    // of uploaded Q4_0 weights (`info` says so), and this product reads it. A third submit.
    let packed = packed.to_device(&gpu).unwrap();
    let got = ops::qmatmul_t(&tensor(&gpu, &act, &[m, k]), &packed, Activations::Q8_0).unwrap();
    let want = ops::qmatmul_t(
        &tensor(&rf, &act, &[m, k]),
        &packed.to_device(&rf).unwrap(),
        Activations::Q8_0,
    )
    .unwrap();
    assert_close(
        "q4_0 × q8_0 product",
        &got.to_vec().unwrap(),
        &want.to_vec().unwrap(),
        1e-3,
    );
    let texels = info.reductions.contains("texels");
    if info.class == DeviceClass::Software {
        assert!(
            texels,
            "a CPU adapter reads Q4_0 weights as texels: {}",
            info.reductions
        );
    }

    let profile = gpu.kernel_profile().unwrap().since(&before);
    eprintln!("{profile:#?}");
    let count = |label: &str| {
        profile
            .kernels
            .iter()
            .find(|k| k.label == label)
            .unwrap_or_else(|| panic!("no {label} in {profile:#?}"))
    };
    assert_eq!(count("elementwise.wgsl::add").dispatches, 3);
    assert_eq!(count("elementwise.wgsl::mul").dispatches, 2);
    let products: Vec<_> = profile
        .kernels
        .iter()
        .filter(|k| k.label.contains("[q4_0"))
        .collect();
    assert!(
        !products.is_empty(),
        "no kernel labelled with q4_0 in {profile:#?}"
    );
    if texels {
        assert_eq!(count("quant::mv_pairs_texels[q4_0 int8]").dispatches, 1);
    }
    for k in &profile.kernels {
        assert!(k.gpu_ns > 0.0, "{} took no GPU time", k.label);
    }
    // Every op's kernels and nothing else (the quantization ran on the reference; a CPU
    // adapter rounds the int8 activations by a dispatch of their own).
    let dispatches: u64 = profile.kernels.iter().map(|k| k.dispatches).sum();
    let roundings: u64 = profile
        .kernels
        .iter()
        .filter(|k| k.label.starts_with("quant::quantize_acts"))
        .map(|k| k.dispatches)
        .sum();
    assert_eq!(
        dispatches,
        5 + roundings + products.iter().map(|k| k.dispatches).sum::<u64>()
    );
    assert_eq!(profile.submits, 3, "{profile:#?}");
    // Kernels run one after another within a submit: their sum fits in the spans.
    assert!(profile.span_ns > 0.0);
    assert!(
        profile.kernel_ns() <= profile.span_ns * 1.001,
        "kernels {} ns exceed the submits' span {} ns",
        profile.kernel_ns(),
        profile.span_ns
    );
}
