//! Constants the GPU kernels share with the host, defined once.
//!
//! The packed formats' codes (what a kernel's `format` parameter or `MV_FORMAT` constant
//! means) and their block geometry come from [`PACKED_FORMATS`] and [`DType`]'s own
//! `block_len`/`block_bytes`. They are emitted as a prelude for each kernel language:
//! `shaders/generated/formats.wgsl` (prepended to every WGSL module when the wgpu pipelines
//! are built) and `src/backend/cuda/kernels/formats.cuh` (prepended to every CUDA source
//! before NVRTC compiles it, and read by `native-tests/cuda_host/emulate.py`). Both files are
//! committed so tools outside Rust (naga's CLI, the emulation) see them; a unit test checks
//! that they are exactly what this table emits (`WEBTENSOR_BLESS=1` rewrites them), and that
//! no kernel source types a block size again.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A packed format the kernels read, and the code they know it by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackedFormat {
    /// The format.
    pub(crate) dtype: DType,
    /// Its code in every kernel (never 0: `MV_FORMAT` 0 means "not specialised").
    pub(crate) code: u32,
    /// The stem of its constants' names: `FMT_<stem>`, `<stem>_BLOCK_LEN`, `<stem>_BLOCK_BYTES`
    /// (read where the preludes are emitted and checked: the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) stem: &'static str,
}

/// Every packed format a kernel reads, with one numbering for WGSL and CUDA.
pub(crate) const PACKED_FORMATS: [PackedFormat; 17] = [
    PackedFormat {
        dtype: DType::F16,
        code: 1,
        stem: "F16",
    },
    PackedFormat {
        dtype: DType::Q8_0,
        code: 2,
        stem: "Q8_0",
    },
    PackedFormat {
        dtype: DType::Q4_0,
        code: 3,
        stem: "Q4_0",
    },
    PackedFormat {
        dtype: DType::TQ1_0,
        code: 4,
        stem: "TQ1_0",
    },
    PackedFormat {
        dtype: DType::TQ2_0,
        code: 5,
        stem: "TQ2_0",
    },
    PackedFormat {
        dtype: DType::TernaryPlanes,
        code: 6,
        stem: "TERNARY_PLANES",
    },
    PackedFormat {
        dtype: DType::Q4_K,
        code: 7,
        stem: "Q4_K",
    },
    PackedFormat {
        dtype: DType::Q6_K,
        code: 8,
        stem: "Q6_K",
    },
    PackedFormat {
        dtype: DType::Q5_K,
        code: 9,
        stem: "Q5_K",
    },
    PackedFormat {
        dtype: DType::Q2_K,
        code: 10,
        stem: "Q2_K",
    },
    PackedFormat {
        dtype: DType::Q3_K,
        code: 11,
        stem: "Q3_K",
    },
    PackedFormat {
        dtype: DType::IQ4_XS,
        code: 12,
        stem: "IQ4_XS",
    },
    PackedFormat {
        dtype: DType::Q4_1,
        code: 13,
        stem: "Q4_1",
    },
    PackedFormat {
        dtype: DType::Q5_0,
        code: 14,
        stem: "Q5_0",
    },
    PackedFormat {
        dtype: DType::Q5_1,
        code: 15,
        stem: "Q5_1",
    },
    PackedFormat {
        dtype: DType::IQ4_NL,
        code: 16,
        stem: "IQ4_NL",
    },
    PackedFormat {
        dtype: DType::BF16,
        code: 17,
        stem: "BF16",
    },
];

/// Added to a weight format's code in the wgpu `MV_FORMAT` constant for int8 activations
/// (above every code: `MV_FORMAT % INT_ACTIVATIONS` is the format's).
pub(crate) const INT_ACTIVATIONS: u32 = 32;

/// Added with [`INT_ACTIVATIONS`] when the wgpu `mv` kernel rounds the f32 activations to
/// int8 itself, in workgroup memory, instead of reading them from a separate dispatch.
pub(crate) const QUANTIZE_ACTIVATIONS: u32 = 64;

/// Added with [`QUANTIZE_ACTIVATIONS`] when the wgpu `mv` kernel first RMS-norms the f32
/// activations (the norm's weight its fourth input, its eps in the parameters).
pub(crate) const NORM_ACTIVATIONS: u32 = 128;

/// The kernels' code for a packed format; `backend` names who asked, for the error.
pub(crate) fn format_code(op: &'static str, format: DType) -> Result<u32> {
    PACKED_FORMATS
        .iter()
        .find(|f| f.dtype == format)
        .map(|f| f.code)
        .ok_or_else(|| Error::invalid(op, format!("{format} is not a packed format")))
}

/// Whether the GPU kernels read `format` weights in rows of `k` values: the group decoders
/// ([`decodes_groups`]) read whole groups of 32 values, and only `BF16`, whose block is one
/// value, can have rows that are not (the block formats' rows are whole blocks, which
/// `Tensor::from_bytes` checks). The engine widens a bf16 matrix for the GPUs where not
/// (`llm::weights::keeps_bf16`, which states the rule again: this module is absent from the
/// threaded wasm build the engine also runs in).
pub(crate) fn gpu_reads_rows(format: DType, k: usize) -> bool {
    !decodes_groups(format) || k.is_multiple_of(32)
}

/// Fails unless the GPU kernels read `format` weights in rows of `k` values
/// ([`gpu_reads_rows`]); `op` names the op for the error.
#[cfg(not(all(target_arch = "wasm32", target_feature = "atomics")))]
pub(crate) fn check_whole_groups(op: &'static str, format: DType, k: usize) -> Result<()> {
    if !gpu_reads_rows(format, k) {
        return Err(Error::invalid(
            op,
            format!(
                "the GPU kernels read {format} weights in groups of 32 values, and these rows \
                 hold {k}; widen the tensor to f32 first (the engine does for such rows)"
            ),
        ));
    }
    Ok(())
}

/// Whether the GPU kernels read `format` through a group decoder (llama.cpp's formats beyond
/// `Q8_0` and `Q4_0`: the super-blocks `Q2_K` … `Q6_K`, `IQ4_XS` and the legacy `Q4_1`,
/// `Q5_0`, `Q5_1`, `IQ4_NL`; and `BF16`), a group of 32 values with every scale and minimum
/// applied: `shaders/kquants/decode.wgsl` on wgpu, `cuda/kernels/decode.cu` on cuda. Their
/// products take f32 activations, and the block formats also llama.cpp's rounding for them,
/// `Q8_K` for the super-blocks and `Q8_0` for the legacy formats (`decodes_with` in
/// `webgpu/kernels/quant.rs`; cuda's `qmatmul_act` and fused products).
pub fn decodes_groups(format: DType) -> bool {
    crate::quant::kquants::is_super_block(format)
        || matches!(
            format,
            DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL | DType::BF16
        )
}

/// The committed WGSL prelude.
pub(crate) const WGSL_PRELUDE: &str = include_str!("../../shaders/generated/formats.wgsl");

/// The committed CUDA prelude.
#[cfg(any(test, feature = "cuda"))]
pub(crate) const CUDA_PRELUDE: &str = include_str!("cuda/kernels/formats.cuh");

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The constants as (name, value), in emission order.
    fn constants() -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for f in PACKED_FORMATS {
            out.push((format!("FMT_{}", f.stem), f.code));
            out.push((format!("{}_BLOCK_LEN", f.stem), f.dtype.block_len() as u32));
            out.push((
                format!("{}_BLOCK_BYTES", f.stem),
                f.dtype.block_bytes() as u32,
            ));
        }
        out.push(("FMT_INT_ACTIVATIONS".into(), INT_ACTIVATIONS));
        out.push(("FMT_QUANTIZE_ACTIVATIONS".into(), QUANTIZE_ACTIVATIONS));
        out.push(("FMT_NORM_ACTIVATIONS".into(), NORM_ACTIVATIONS));
        out
    }

    const HEADER: &str = "// Generated from src/backend/kernel_consts.rs by its tests \
                          (WEBTENSOR_BLESS=1 rewrites it): do not edit.\n\
                          // Packed formats: FMT_* codes (one numbering for WGSL and CUDA), block \
                          values and bytes.\n";

    /// The WGSL prelude this table emits.
    fn emit_wgsl() -> String {
        let mut s = HEADER.to_string();
        for (name, v) in constants() {
            s.push_str(&format!("const {name}: u32 = {v}u;\n"));
        }
        s
    }

    /// The CUDA prelude this table emits.
    fn emit_cuda() -> String {
        let mut s = HEADER.to_string();
        for (name, v) in constants() {
            s.push_str(&format!("static constexpr unsigned int {name} = {v}u;\n"));
        }
        s
    }

    /// Compares a committed prelude with the table's emission, rewriting it under
    /// `WEBTENSOR_BLESS=1`.
    fn check(committed: &str, emitted: &str, path: &str) {
        if committed == emitted {
            return;
        }
        if std::env::var_os("WEBTENSOR_BLESS").is_some() {
            let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
            std::fs::write(&full, emitted).expect("writable prelude");
            panic!("{path} rewritten from the table: rebuild and rerun");
        }
        panic!(
            "{path} differs from what src/backend/kernel_consts.rs emits; run \
             `WEBTENSOR_BLESS=1 cargo test --lib kernel_consts` to regenerate it.\n\
             emitted:\n{emitted}"
        );
    }

    #[test]
    fn preludes_are_the_table() {
        check(WGSL_PRELUDE, &emit_wgsl(), "shaders/generated/formats.wgsl");
        check(
            CUDA_PRELUDE,
            &emit_cuda(),
            "src/backend/cuda/kernels/formats.cuh",
        );
        assert!(WGSL_PRELUDE.contains("const Q8_0_BLOCK_BYTES: u32 = 34u;"));
        assert!(CUDA_PRELUDE.contains("FMT_F16 = 1u;"));
    }

    #[test]
    fn codes_are_distinct_and_not_zero() {
        for (i, a) in PACKED_FORMATS.iter().enumerate() {
            assert_ne!(a.code, 0, "{}", a.stem);
            assert!(a.code < INT_ACTIVATIONS, "{}", a.stem);
            for b in &PACKED_FORMATS[i + 1..] {
                assert_ne!(a.code, b.code, "{} and {}", a.stem, b.stem);
            }
        }
        assert_eq!(format_code("t", DType::Q4_0).unwrap(), 3);
        assert!(format_code("t", DType::F32).is_err());
        for legacy in [DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL] {
            assert!(decodes_groups(legacy), "{legacy}");
        }
        assert!(!decodes_groups(DType::Q4_0));
    }

    /// The GPU kernels read every weight format webtensor loads (so an upload to wgpu or cuda
    /// never meets one without a code), and `BF16`, the one whose rows need not be whole
    /// groups, is refused in rows that are not.
    #[test]
    fn every_weight_format_has_a_code_and_bf16_rows_are_whole_groups() {
        for f in &crate::quant::FORMATS {
            assert!(
                PACKED_FORMATS.iter().any(|p| p.dtype == f.dtype),
                "{} has no kernel code",
                f.dtype
            );
        }
        assert!(check_whole_groups("t", DType::BF16, 64).is_ok());
        assert!(check_whole_groups("t", DType::Q4_0, 48).is_ok());
        let e = check_whole_groups("t", DType::BF16, 48).unwrap_err();
        assert!(e.to_string().contains("hold 48"), "{e}");
    }

    /// Every `.wgsl` under `shaders/` and `.cu` under the cuda kernels, comments removed.
    fn kernel_sources() -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        let mut dirs = vec![root.join("shaders"), root.join("src/backend/cuda/kernels")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("readable kernel folder") {
                let path = entry.expect("readable entry").path();
                if path.is_dir() {
                    if !path.ends_with("generated") {
                        dirs.push(path);
                    }
                    continue;
                }
                let ext = path.extension().and_then(|e| e.to_str());
                if !matches!(ext, Some("wgsl" | "cu")) {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("readable kernel source");
                let code: String = text
                    .lines()
                    .map(|l| l.split("//").next().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n");
                files.push((path.display().to_string(), code));
            }
        }
        files
    }

    /// A block size typed as a number in a kernel (`34`, `18u`, ...) instead of the prelude's
    /// constant: it would drift from the table. `Q4_1`'s 20 bytes and `Q5_1`'s 24 are not
    /// looked for: the kernels shift by 20 and 24 bits (`>> 24u`) all over.
    #[test]
    fn no_kernel_types_a_block_size() {
        let sizes: Vec<String> = PACKED_FORMATS
            .iter()
            .filter(|f| f.dtype.block_len() > 1 && !matches!(f.dtype.block_bytes(), 20 | 24))
            .map(|f| f.dtype.block_bytes().to_string())
            .collect();
        let sources = kernel_sources();
        assert!(
            sources.len() >= 20,
            "found {} kernel sources",
            sources.len()
        );
        let mut found = Vec::new();
        for (path, code) in &sources {
            let tokens = code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'));
            for t in tokens {
                let t = t.trim_end_matches('u');
                if sizes.iter().any(|s| s == t) {
                    found.push(format!("{path}: {t}"));
                }
            }
        }
        assert!(
            found.is_empty(),
            "block sizes typed in kernels (use the prelude's *_BLOCK_BYTES):\n{}",
            found.join("\n")
        );
    }
}
