//! Choosing backends: priority lists, the environment and config file, software adapters,
//! and per-op fallback.

mod common;

use common::{assert_close, reference, rng, tensor, uniform};
use webtensor::backend::{BackendKind, OpKind};
use webtensor::device::{parse_config, priority_from_environment, BACKEND_ENV};
use webtensor::{ops, Device, Error};

#[test]
fn config_file_gives_a_priority_list() {
    let list = parse_config("priority = [\"wgpu\", \"CPU\"]", "test.toml").unwrap();
    assert_eq!(list, vec![BackendKind::Wgpu, BackendKind::Cpu]);
    let err = parse_config("priority = [\"wgpu\", \"metal\"]", "test.toml").unwrap_err();
    assert!(
        matches!(err, Error::UnknownBackend { ref name, .. } if name == "metal"),
        "{err}"
    );
    assert!(
        err.to_string().contains("cuda, wgpu, cpu, reference"),
        "{err}"
    );
    assert!(matches!(
        parse_config("priority = []", "t"),
        Err(Error::Config { .. })
    ));
    assert!(matches!(
        parse_config("priorty = [\"cpu\"]", "t"),
        Err(Error::Config { .. })
    ));
    assert!(matches!(
        parse_config("priority = \"cpu\"", "t"),
        Err(Error::Config { .. })
    ));
}

/// The only test that touches the process environment, so no other test races with it.
/// (`Device::cpu` and the builder read no variable, so the other tests are unaffected.)
#[test]
fn environment_overrides_the_priority_list() {
    std::env::set_var(BACKEND_ENV, "reference, cpu");
    let (list, _) = priority_from_environment().unwrap();
    assert_eq!(list, vec![BackendKind::Reference, BackendKind::Cpu]);
    assert_eq!(Device::auto().unwrap().backend_name(), "reference");
    std::env::set_var(BACKEND_ENV, "tpu");
    assert!(matches!(Device::auto(), Err(Error::UnknownBackend { .. })));
    std::env::remove_var(BACKEND_ENV);
    // The options' overrides are read by `auto` too; a bad value names the variable and the
    // values it takes.
    std::env::set_var(BACKEND_ENV, "cpu");
    std::env::set_var("WEBTENSOR_CPU_SIMD", "scalar");
    assert_eq!(
        Device::auto().unwrap().info().simd.as_deref(),
        Some("scalar")
    );
    std::env::set_var("WEBTENSOR_CPU_SIMD", "sse9");
    let err = Device::auto().unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("WEBTENSOR_CPU_SIMD") && text.contains("avx512"),
        "{text}"
    );
    std::env::remove_var("WEBTENSOR_CPU_SIMD");
    std::env::remove_var(BACKEND_ENV);
}

#[test]
fn cuda_is_absent_with_a_reason_and_skipped() {
    let err = Device::new("cuda").unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
    let dev = Device::builder()
        .priority(vec![BackendKind::Cuda, BackendKind::Cpu])
        .build()
        .unwrap();
    assert_eq!(dev.backend_name(), "cpu");
    assert!(dev
        .decisions()
        .iter()
        .any(|d| d.kind == BackendKind::Cuda && !d.used && d.reason.contains("cuda")));
}

#[test]
fn reference_always_ends_the_chain() {
    let dev = Device::cpu();
    assert_eq!(dev.chain(), vec![BackendKind::Cpu, BackendKind::Reference]);
}

#[test]
fn software_adapters_rank_below_cpu_unless_named() {
    let Some(wgpu) = common::wgpu() else { return };
    assert_eq!(
        wgpu.backend_name(),
        "wgpu",
        "naming wgpu picks it even when it is software"
    );
    let software = wgpu.info().class == webtensor::backend::DeviceClass::Software;
    let auto = Device::builder().build().unwrap();
    if software {
        assert_eq!(auto.backend_name(), "cpu");
        let decision = auto
            .decisions()
            .iter()
            .find(|d| d.kind == BackendKind::Wgpu)
            .unwrap();
        assert!(decision.reason.contains("software"), "{}", decision.reason);
    } else {
        assert_eq!(auto.backend_name(), "wgpu");
    }
}

#[test]
fn a_disabled_op_falls_back_visibly() {
    let dev = Device::builder()
        .priority(vec![BackendKind::Cpu])
        .disable_op(BackendKind::Cpu, OpKind::Softmax)
        .build()
        .unwrap();
    let x = uniform(&mut rng(20), 12, 3.0);
    let y = ops::softmax(&tensor(&dev, &x, &[3, 4])).unwrap();
    assert_eq!(y.backend_name(), "reference");
    let fallbacks = dev.fallbacks();
    assert_eq!(fallbacks.len(), 1);
    assert_eq!(
        (fallbacks[0].op, fallbacks[0].from, fallbacks[0].to),
        (OpKind::Softmax, BackendKind::Cpu, BackendKind::Reference)
    );
    // The next op takes the fallback's output back to the primary.
    let z = ops::silu(&y).unwrap();
    assert_eq!(z.backend_name(), "cpu");
    let want = ops::silu(&ops::softmax(&tensor(&reference(), &x, &[3, 4])).unwrap()).unwrap();
    assert_close(
        "fallback chain",
        &z.to_vec::<f32>().unwrap(),
        &want.to_vec::<f32>().unwrap(),
        1e-5,
    );
}

#[test]
fn wgpu_falls_back_to_cpu_and_back() {
    let Some(_) = common::wgpu() else { return };
    let dev = Device::builder()
        .priority(vec![BackendKind::Wgpu, BackendKind::Cpu])
        .disable_op(BackendKind::Wgpu, OpKind::RmsNorm)
        .build()
        .unwrap();
    let x = uniform(&mut rng(21), 2 * 64, 2.0);
    let w = uniform(&mut rng(22), 64, 1.0);
    let h = ops::silu(&tensor(&dev, &x, &[2, 64])).unwrap();
    let n = ops::rms_norm(&h, &tensor(&dev, &w, &[64]), 1e-6).unwrap();
    assert_eq!(n.backend_name(), "cpu");
    let out = ops::scale(&n, 2.0).unwrap();
    assert_eq!(out.backend_name(), "wgpu");
    let r = reference();
    let want = ops::scale(
        &ops::rms_norm(
            &ops::silu(&tensor(&r, &x, &[2, 64])).unwrap(),
            &tensor(&r, &w, &[64]),
            1e-6,
        )
        .unwrap(),
        2.0,
    )
    .unwrap();
    assert_close(
        "wgpu→cpu→wgpu",
        &out.to_vec::<f32>().unwrap(),
        &want.to_vec::<f32>().unwrap(),
        1e-5,
    );
    assert_eq!(dev.fallbacks()[0].to, BackendKind::Cpu);
}

/// Options set on the builder reach the backend it starts, which lists them in its `info`;
/// devices with the same options share a backend, and the defaults are the shared instance
/// `Device::cpu` uses.
#[test]
fn options_reach_the_backend_they_start() {
    use webtensor::backend::cpu::SimdLevel;
    use webtensor::backend::BackendOptions;
    let mut options = BackendOptions::default();
    options.cpu.simd = Some(SimdLevel::Scalar);
    let scalar = Device::builder()
        .priority(vec![BackendKind::Cpu])
        .options(options.clone())
        .build()
        .unwrap();
    assert_eq!(scalar.options(), &options);
    let info = scalar.info();
    assert_eq!(info.simd.as_deref(), Some("scalar"));
    assert!(
        info.options.contains(&("cpu.simd".into(), "scalar".into())),
        "{:?}",
        info.options
    );
    let plain = Device::cpu();
    assert_eq!(plain.options(), &BackendOptions::default());
    assert!(
        plain
            .info()
            .options
            .contains(&("cpu.simd".into(), "auto".into())),
        "{:?}",
        plain.info().options
    );
    // Scalar and detected products agree (the option changed the kernels, not the results).
    let mut r = rng(9);
    let (a, b) = (uniform(&mut r, 6 * 70, 1.0), uniform(&mut r, 70 * 5, 1.0));
    let product = |d: &Device| {
        ops::matmul(&tensor(d, &a, &[6, 70]), &tensor(d, &b, &[70, 5]))
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_close("scalar matmul", &product(&scalar), &product(&plain), 1e-5);
    // Options in JSON (as `createDevice` takes them) name an unknown key.
    let err = serde_json::from_str::<BackendOptions>(r#"{"cpu": {"smid": "avx2"}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("smid"), "{err}");
}
