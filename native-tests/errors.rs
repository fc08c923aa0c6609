//! Bad input gets a typed error on every op, never a panic or a wrong answer.

mod common;

use common::{cpu, tensor};
use webtensor::ops::{self, Activations, RopeLayout};
use webtensor::{DType, Device, Error, Tensor};

fn f(dev: &Device, shape: &[usize]) -> Tensor {
    tensor(dev, &vec![0.5f32; shape.iter().product()], shape)
}

fn u(dev: &Device, shape: &[usize]) -> Tensor {
    tensor(dev, &vec![1u32; shape.iter().product()], shape)
}

fn check_errors(dev: &Device) {
    let shape_err = |r: webtensor::Result<Tensor>| {
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })), "{r:?}")
    };
    let dtype_err = |r: webtensor::Result<Tensor>| {
        assert!(matches!(r, Err(Error::DTypeMismatch { .. })), "{r:?}")
    };
    let arg_err = |r: webtensor::Result<Tensor>| {
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}")
    };

    shape_err(ops::add(&f(dev, &[2, 3]), &f(dev, &[2])));
    shape_err(ops::mul(&f(dev, &[3]), &f(dev, &[2, 3])));
    dtype_err(ops::swiglu(&f(dev, &[3]), &u(dev, &[3])));
    dtype_err(ops::silu(&u(dev, &[3])));
    arg_err(ops::scale(&f(dev, &[3]), f32::NAN));
    shape_err(ops::rms_norm(&f(dev, &[2, 4]), &f(dev, &[3]), 1e-6));
    arg_err(ops::rms_norm(&f(dev, &[2, 4]), &f(dev, &[4]), -1.0));
    shape_err(ops::layer_norm(
        &f(dev, &[2, 4]),
        &f(dev, &[4]),
        &f(dev, &[5]),
        1e-5,
    ));
    shape_err(ops::softmax_causal(&f(dev, &[4, 2])));
    shape_err(ops::rope(
        &f(dev, &[2, 3, 4]),
        &u(dev, &[3]),
        &f(dev, &[2]),
        RopeLayout::HalfSplit,
    ));
    shape_err(ops::rope(
        &f(dev, &[2, 3, 5]),
        &u(dev, &[2]),
        &f(dev, &[2]),
        RopeLayout::HalfSplit,
    ));
    shape_err(ops::rope(
        &f(dev, &[6, 4]),
        &u(dev, &[6]),
        &f(dev, &[2]),
        RopeLayout::HalfSplit,
    ));
    dtype_err(ops::rope(
        &f(dev, &[2, 3, 4]),
        &f(dev, &[2]),
        &f(dev, &[2]),
        RopeLayout::HalfSplit,
    ));
    shape_err(ops::rope(
        &f(dev, &[2, 3, 4]),
        &u(dev, &[2]),
        &f(dev, &[3]),
        RopeLayout::HalfSplit,
    ));
    dtype_err(ops::rope(
        &f(dev, &[2, 3, 4]),
        &u(dev, &[2]),
        &u(dev, &[2]),
        RopeLayout::HalfSplit,
    ));
    shape_err(ops::matmul(&f(dev, &[2, 3]), &f(dev, &[2, 3])));
    shape_err(ops::matmul_t(&f(dev, &[2, 3]), &f(dev, &[3, 2])));
    shape_err(ops::matmul(&f(dev, &[3]), &f(dev, &[3, 2])));
    shape_err(ops::matmul(&f(dev, &[2, 2, 3]), &f(dev, &[3, 3, 2])));
    shape_err(ops::embedding(&f(dev, &[10]), &u(dev, &[2])));
    dtype_err(ops::embedding(&f(dev, &[10, 4]), &f(dev, &[2])));
    let ids = tensor(dev, &[3u32, 10], &[2]);
    arg_err(ops::embedding(&f(dev, &[10, 4]), &ids));
    arg_err(ops::permute(&f(dev, &[2, 3]), &[0, 0]));
    arg_err(ops::permute(&f(dev, &[2, 3]), &[1]));
    arg_err(ops::transpose(&f(dev, &[2, 3]), 0, 2));
    shape_err(ops::argmax(&f(dev, &[3, 0])));
    dtype_err(ops::argmax(&u(dev, &[3, 2])));

    assert!(matches!(
        Tensor::from_slice(dev, &[1.0f32; 5], [2, 3]),
        Err(Error::DataLength { .. })
    ));
    assert!(matches!(
        f(dev, &[2, 3]).reshape([4, 2]),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        f(dev, &[2]).to_vec::<u32>(),
        Err(Error::DTypeMismatch { .. })
    ));
    quant_errors(dev);
    scan_errors(dev);
    layout_errors(dev);
    cache_and_sampling_errors(dev);
}

fn cache_and_sampling_errors(dev: &Device) {
    let params = ops::SampleParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.9,
    };
    let slots = |v: &[u32]| tensor(dev, v, &[v.len()]);
    let mut dst = f(dev, &[4, 3]);
    let before: Vec<f32> = dst.to_vec().unwrap();
    // A slot beyond the rows, a row width that differs, slots of the wrong count or dtype.
    let results = [
        ops::scatter_rows(&mut dst, &slots(&[4]), &f(dev, &[1, 3])),
        ops::scatter_rows(&mut dst, &slots(&[0]), &f(dev, &[1, 2])),
        ops::scatter_rows(&mut dst, &slots(&[0, 1]), &f(dev, &[1, 3])),
        ops::scatter_rows(&mut dst, &f(dev, &[1]), &f(dev, &[1, 3])),
        ops::scatter_rows(&mut dst, &slots(&[0]), &u(dev, &[1, 3])),
    ];
    for r in &results {
        assert!(
            matches!(
                r,
                Err(Error::InvalidArgument { .. }
                    | Error::ShapeMismatch { .. }
                    | Error::DTypeMismatch { .. })
            ),
            "{r:?}"
        );
    }
    assert_eq!(
        dst.to_vec::<f32>().unwrap(),
        before,
        "a refused write changes nothing"
    );
    // Sampling: one number per row, f32 logits, a real top_p.
    let logits = f(dev, &[2, 5]);
    assert!(matches!(
        ops::sample(&logits, &f(dev, &[3]), params),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::sample(&u(dev, &[2, 5]), &f(dev, &[2]), params),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::sample(&f(dev, &[2, 0]), &f(dev, &[2]), params),
        Err(Error::ShapeMismatch { .. })
    ));
    let nan_p = ops::SampleParams {
        top_p: f32::NAN,
        ..params
    };
    assert!(matches!(
        ops::sample(&logits, &f(dev, &[2]), nan_p),
        Err(Error::InvalidArgument { .. })
    ));
}

fn layout_errors(dev: &Device) {
    assert!(matches!(
        ops::narrow(&f(dev, &[2, 3]), 1, 2, 2),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::narrow(&f(dev, &[2, 3]), 2, 0, 1),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::concat(&f(dev, &[2, 3]), &f(dev, &[3, 2]), 0),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::concat(&f(dev, &[2, 3]), &f(dev, &[2, 3]), 2),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::concat(&f(dev, &[2]), &u(dev, &[2]), 0),
        Err(Error::DTypeMismatch { .. })
    ));
}

fn scan_errors(dev: &Device) {
    let (a, b) = (f(dev, &[2, 5, 3]), f(dev, &[2, 5, 3]));
    // Axis out of range, mismatched operands, an initial state of the wrong shape, u32 input.
    assert!(matches!(
        ops::linear_scan(&a, &b, &f(dev, &[2, 3]), 3),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        ops::linear_scan(&a, &f(dev, &[2, 5]), &f(dev, &[2, 3]), 1),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::linear_scan(&a, &b, &f(dev, &[2, 5]), 1),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::log_cumprod(&u(dev, &[4]), 0),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::logcumsumexp(&f(dev, &[4]), 1),
        Err(Error::InvalidArgument { .. })
    ));
    let h = f(dev, &[2, 5, 3]);
    assert!(matches!(
        ops::linear_scan_backward(&a, &f(dev, &[2, 3]), &h, &f(dev, &[2, 5, 4]), 1),
        Err(Error::ShapeMismatch { .. })
    ));
    // Backward: an axis out of range, `h` or `h0` of the wrong shape, a u32 gradient.
    assert!(matches!(
        ops::linear_scan_backward(&a, &f(dev, &[2, 3]), &h, &h, 5),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        ops::linear_scan_backward(&a, &f(dev, &[2, 3]), &f(dev, &[2, 3, 5]), &h, 1),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::linear_scan_backward(&a, &f(dev, &[5, 3]), &h, &h, 1),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::linear_scan_backward(&a, &f(dev, &[2, 3]), &h, &u(dev, &[2, 5, 3]), 1),
        Err(Error::DTypeMismatch { .. })
    ));
    // A u32 `b`, a u32 state, the state of another axis.
    assert!(matches!(
        ops::linear_scan(&a, &u(dev, &[2, 5, 3]), &f(dev, &[2, 3]), 1),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::linear_scan(&a, &b, &u(dev, &[2, 3]), 1),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::linear_scan(&a, &b, &f(dev, &[2, 3]), 2),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::log_cumprod(&f(dev, &[2, 5, 3]), 3),
        Err(Error::InvalidArgument { .. })
    ));
}

fn quant_errors(dev: &Device) {
    let q8 = |n: usize, k: usize| ops::quantize(&f(dev, &[n, k]), DType::Q8_0).unwrap();
    // A row that is not whole blocks, a non-format target, a truncated or oversized buffer.
    assert!(matches!(
        ops::quantize(&f(dev, &[2, 33]), DType::Q8_0),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::quantize(&f(dev, &[2, 32]), DType::I8),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        Tensor::from_bytes(dev, DType::Q4_0, vec![0; 35], [2, 32]),
        Err(Error::DataLength { .. })
    ));
    assert!(matches!(
        Tensor::from_bytes(dev, DType::TQ2_0, vec![0; 66], [1, 255]),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(q8(2, 64).reshape([4, 32]).is_ok());
    assert!(matches!(
        q8(2, 64).reshape([1, 128]).and_then(|t| t.reshape([8, 16])),
        Err(Error::ShapeMismatch { .. })
    ));
    // Products: k mismatch, f32 weights, int8 activations with f16 weights, wrong dtypes.
    assert!(matches!(
        ops::qmatmul_t(&f(dev, &[1, 32]), &q8(4, 64), Activations::F32),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::qmatmul_t(&f(dev, &[1, 32]), &f(dev, &[4, 32]), Activations::F32),
        Err(Error::InvalidArgument { .. })
    ));
    let h = ops::quantize(&f(dev, &[4, 32]), DType::F16).unwrap();
    assert!(matches!(
        ops::qmatmul_t(&f(dev, &[1, 32]), &h, Activations::I8),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        ops::qmatmul_t(&f(dev, &[1, 32]), &q8(4, 32), Activations::F16),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::dequantize(&f(dev, &[2])),
        Err(Error::InvalidArgument { .. })
    ));
    // ternary_dot wants ternary weights and int8 activations.
    let x = tensor(dev, &[1i8; 256], &[1, 256]);
    assert!(matches!(
        ops::ternary_dot(&q8(2, 256), &x),
        Err(Error::InvalidArgument { .. })
    ));
    let t = ops::quantize(&f(dev, &[2, 256]), DType::TQ2_0).unwrap();
    assert!(matches!(
        ops::ternary_dot(&t, &f(dev, &[1, 256])),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::ternary_dot(&t, &tensor(dev, &[1i8; 512], &[1, 512])),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn cpu_rejects_bad_input() {
    check_errors(&cpu());
}

#[test]
fn wgpu_rejects_bad_input() {
    if let Some(dev) = common::wgpu() {
        check_errors(&dev);
    }
}

#[test]
fn mixing_devices_is_an_error() {
    let a = f(&cpu(), &[3]);
    let b = f(&Device::reference(), &[3]);
    assert!(matches!(
        ops::add(&a, &b),
        Err(Error::DeviceMismatch { .. })
    ));
    // Moving one over makes it work.
    let b = b.to_device(a.device()).unwrap();
    assert_eq!(
        ops::add(&a, &b).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 3]
    );
}

#[test]
fn messages_say_what_was_wrong() {
    let err = ops::matmul_t(&f(&cpu(), &[2, 3]), &f(&cpu(), &[4, 5]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("matmul_t") && err.contains("[2, 3]") && err.contains("[4, 5]"),
        "{err}"
    );
    let err = Device::new("vulkan").unwrap_err().to_string();
    assert!(
        err.contains("wgpu") && err.contains("cpu") && err.contains("reference"),
        "{err}"
    );
}

#[test]
fn wgpu_refuses_a_tensor_over_its_binding_limit() {
    let Some(dev) = common::wgpu() else { return };
    let limit = dev
        .info()
        .limits
        .iter()
        .find(|(name, _)| name == "max_storage_buffer_binding_size")
        .map(|&(_, v)| v)
        .expect("wgpu reports its max storage binding");
    // One element more than fits in a binding: such a tensor can be held (products and
    // gathers read it in row ranges), but an op that binds it whole is refused.
    let n = (limit / 4 + 1) as usize;
    if n > 600_000_000 {
        eprintln!("skipping: the binding limit ({limit} bytes) is too large to exceed cheaply");
        return;
    }
    let t = Tensor::from_vec(&dev, vec![0f32; n], [n]).unwrap();
    let r = ops::silu(&t);
    assert!(matches!(r, Err(Error::TensorTooLarge { .. })), "{r:?}");
}
