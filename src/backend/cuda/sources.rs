//! The CUDA C kernel sources (`kernels/*.cu`) and their compilation by NVRTC.
//!
//! Each source is compiled as the constants prelude `kernels/formats.cuh` (generated from
//! `src/backend/kernel_consts.rs`), `kernels/common.cu`, `kernels/decode.cu` (the group
//! decoder of llama.cpp's formats), then the file itself, so kernels
//! share constants and helpers without NVRTC include paths (and without any CUDA header: the sources use
//! only NVRTC's built-in device functions). The backend compiles every source once when it
//! starts, for the device's architecture; `native-tests/cuda_kernels.rs` compiles them all
//! with a real NVRTC where no GPU exists, so a kernel that does not compile fails CI.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use crate::backend::kernel_consts::CUDA_PRELUDE;

/// The helpers prepended to every source.
const COMMON: &str = include_str!("kernels/common.cu");

/// The group decoder of llama.cpp's formats beyond `Q8_0` and `Q4_0`, prepended after
/// [`COMMON`] (it reads its block readers).
const DECODE: &str = include_str!("kernels/decode.cu");

/// One kernel source file and the entry points the backend launches from it.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// The file name under `src/backend/cuda/kernels/`.
    pub name: &'static str,
    /// The file's text (without the common prelude).
    pub body: &'static str,
    /// The `extern "C" __global__` functions the backend loads.
    pub entry_points: &'static [&'static str],
}

impl KernelSource {
    /// The full text NVRTC compiles: the constants, common and decoder preludes, then the file.
    pub fn text(&self) -> String {
        format!(
            "{CUDA_PRELUDE}\n{COMMON}\n{DECODE}\n// ---- {} ----\n{}",
            self.name, self.body
        )
    }
}

/// Every kernel source of the backend.
pub const SOURCES: [KernelSource; 7] = [
    KernelSource {
        name: "elementwise.cu",
        body: include_str!("kernels/elementwise.cu"),
        entry_points: &[
            "unary_f32",
            "binary_f32",
            "embedding_f32",
            "permute_u32",
            "concat_u32",
            "narrow_u32",
            "scatter_rows_u32",
        ],
    },
    KernelSource {
        name: "norm.cu",
        body: include_str!("kernels/norm.cu"),
        entry_points: &[
            "rms_norm_f32",
            "layer_norm_f32",
            "softmax_f32",
            "argmax_f32",
            "rope_f32",
        ],
    },
    KernelSource {
        name: "matmul.cu",
        body: include_str!("kernels/matmul.cu"),
        entry_points: &["matmul_f32", "matvec_f32"],
    },
    KernelSource {
        name: "quant.cu",
        body: include_str!("kernels/quant.cu"),
        entry_points: &[
            "quantize",
            "dequantize",
            "qmatmul_act",
            "qmatmul",
            "ternary_dot",
        ],
    },
    KernelSource {
        name: "scan.cu",
        body: include_str!("kernels/scan.cu"),
        entry_points: &["scan_f32", "scan_grad_a", "scan_grad_init"],
    },
    KernelSource {
        name: "sample.cu",
        body: include_str!("kernels/sample.cu"),
        entry_points: &["sample_f32"],
    },
    KernelSource {
        name: "fused.cu",
        body: include_str!("kernels/fused.cu"),
        entry_points: &[
            "fused_prepare",
            "fused_linear_f32",
            "fused_linear_i8",
            "paged_attention",
        ],
    },
];

/// Whether the NVRTC library can be loaded (it is looked up on the library search path,
/// e.g. `LD_LIBRARY_PATH`, as `libnvrtc.so.12` and similar names).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library; no NVRTC function is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The virtual architectures this NVRTC can target, as `XY` of `compute_XY`, ascending.
/// Each CUDA release drops old ones (CUDA 13's NVRTC no longer targets Volta, `compute_70`).
/// Call only when [`nvrtc_present`] is true.
pub fn supported_arches() -> Result<Vec<u32>, String> {
    use cudarc::nvrtc::sys::{nvrtcGetNumSupportedArchs, nvrtcGetSupportedArchs, nvrtcResult};
    let mut count = 0i32;
    // SAFETY: writes one int.
    let status = unsafe { nvrtcGetNumSupportedArchs(&mut count) };
    if status != nvrtcResult::NVRTC_SUCCESS {
        return Err(format!(
            "NVRTC could not list its architectures: {status:?}"
        ));
    }
    let mut arches = vec![0i32; count.max(0) as usize];
    // SAFETY: the buffer holds the `count` ints NVRTC writes.
    let status = unsafe { nvrtcGetSupportedArchs(arches.as_mut_ptr()) };
    if status != nvrtcResult::NVRTC_SUCCESS {
        return Err(format!(
            "NVRTC could not list its architectures: {status:?}"
        ));
    }
    let mut arches: Vec<u32> = arches
        .into_iter()
        .filter_map(|a| u32::try_from(a).ok())
        .collect();
    arches.sort_unstable();
    Ok(arches)
}

/// The architecture to compile for on a device of compute capability `device` (`XY`): the
/// device's own where NVRTC knows it, else the newest older one NVRTC targets (the driver
/// compiles that PTX for the newer device). `Err` says why when NVRTC targets nothing this
/// device runs (an NVRTC newer than the GPU generation).
pub fn arch_for(device: u32, supported: &[u32]) -> Result<String, String> {
    match supported.iter().rev().find(|&&a| a <= device) {
        Some(a) => Ok(format!("compute_{a}")),
        None => Err(format!(
            "this NVRTC targets compute_{} and newer, but the device is compute_{device}: \
             use an NVRTC from an older CUDA toolkit (e.g. `pip install nvidia-cuda-nvrtc-cu12`)",
            supported.first().map_or_else(|| "?".into(), u32::to_string)
        )),
    }
}

/// Compiles `source` to PTX for `arch` (`compute_XY`). The error carries NVRTC's log.
/// Call only when [`nvrtc_present`] is true (cudarc panics when the library is missing).
pub fn compile(source: &KernelSource, arch: &str) -> Result<String, String> {
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some(source.name.to_string()),
        ..Default::default()
    };
    match compile_ptx_with_opts(source.text(), opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { nvrtc, log, .. }) => Err(format!(
            "NVRTC could not compile {} for {arch} ({nvrtc:?}):\n{}",
            source.name,
            log.to_string_lossy()
        )),
        Err(e) => Err(format!("NVRTC failed on {}: {e:?}", source.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::arch_for;

    #[test]
    fn the_device_architecture_is_used_where_nvrtc_knows_it() {
        assert_eq!(
            arch_for(90, &[75, 80, 86, 89, 90, 100]).unwrap(),
            "compute_90"
        );
    }

    #[test]
    fn an_unknown_newer_device_gets_the_newest_older_architecture() {
        assert_eq!(arch_for(120, &[70, 75, 80, 90]).unwrap(), "compute_90");
        assert_eq!(arch_for(87, &[75, 80, 86, 89, 90]).unwrap(), "compute_86");
    }

    #[test]
    fn a_device_older_than_every_target_is_an_error_that_says_what_to_do() {
        let err = arch_for(70, &[75, 80, 90]).unwrap_err();
        assert!(
            err.contains("compute_75") && err.contains("compute_70"),
            "{err}"
        );
        assert!(err.contains("nvidia-cuda-nvrtc-cu12"), "{err}");
    }
}
