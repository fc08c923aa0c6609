//! Compiles every CUDA kernel source with the real NVRTC, for a GPU-less CI machine.
//!
//! The `cuda` backend compiles `src/backend/cuda/kernels/*.cu` at run time; without a GPU
//! that never happens, so this test does it: each source must compile to PTX for the oldest
//! architecture this NVRTC targets and for Hopper, and the PTX must contain every entry point the backend loads.
//! NVRTC comes from the CUDA toolkit or from PyPI (`nvidia-cuda-nvrtc-cu12`; `scripts/test.sh`
//! puts its folder on `LD_LIBRARY_PATH`). A missing NVRTC fails the test unless
//! `WEBTENSOR_ALLOW_NO_NVRTC=1` says to skip.

use webtensor::backend::cuda::sources::{
    arch_for, compile, nvrtc_present, supported_arches, SOURCES,
};

/// The oldest architecture this NVRTC targets (Volta for CUDA 12, Turing for CUDA 13) and
/// Hopper (or the newest older one it knows).
fn arches() -> Vec<String> {
    let supported = supported_arches().expect("NVRTC lists its architectures");
    let oldest = *supported.first().expect("NVRTC targets some architecture");
    let mut arches = vec![format!("compute_{oldest}")];
    let hopper = arch_for(90, &supported).expect("an NVRTC that targets Hopper");
    if !arches.contains(&hopper) {
        arches.push(hopper);
    }
    arches
}

#[test]
fn every_kernel_source_compiles_with_nvrtc() {
    if !nvrtc_present() {
        if std::env::var("WEBTENSOR_ALLOW_NO_NVRTC").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED: NVRTC (libnvrtc.so.12) is not on the library path");
            return;
        }
        panic!(
            "NVRTC (libnvrtc.so.12) is not on the library path: `pip install \
             nvidia-cuda-nvrtc-cu12` and add site-packages/nvidia/cuda_nvrtc/lib to \
             LD_LIBRARY_PATH (scripts/test.sh does), or set WEBTENSOR_ALLOW_NO_NVRTC=1"
        );
    }
    let mut failures = Vec::new();
    let arches = arches();
    for source in &SOURCES {
        for arch in &arches {
            match compile(source, arch) {
                Ok(ptx) => {
                    for entry in source.entry_points {
                        let decl = format!(".entry {entry}(");
                        if !ptx.contains(&decl) {
                            failures.push(format!(
                                "{} ({arch}): the PTX has no entry point `{entry}`",
                                source.name
                            ));
                        }
                    }
                    println!("{} for {arch}: {} bytes of PTX", source.name, ptx.len());
                }
                Err(log) => failures.push(log),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_broken_kernel_fails_with_the_nvrtc_log() {
    if !nvrtc_present() {
        return;
    }
    let broken = webtensor::backend::cuda::sources::KernelSource {
        name: "broken.cu",
        body: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        entry_points: &["k"],
    };
    let err = compile(&broken, &arches()[0]).expect_err("an undefined name must not compile");
    assert!(err.contains("undefined_name"), "{err}");
}
