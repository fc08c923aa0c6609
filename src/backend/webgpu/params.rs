//! Each shader's `Params` uniform as a `#[repr(C)]` [`Pod`] struct, its Rust twin.
//!
//! A kernel's parameters are filled by field name, never by position, and written as the
//! struct's bytes. The test below parses every shader with naga and checks that each WGSL
//! `Params` has the same size, member names and offsets as the struct declared for it here.

use bytemuck::{Pod, Zeroable};

use super::pipelines::Shader;

/// A parameter block and the shaders whose `Params` it mirrors.
pub(crate) trait KernelParams: Pod {
    /// The shaders declaring this `Params` layout.
    const SHADERS: &'static [Shader];
}

/// Declares a `Params` struct, the shaders it belongs to and (for the reflection test) its
/// members' names and offsets.
macro_rules! params {
    ($(#[$m:meta])* $name:ident for [$($shader:ident),+] { $($field:ident: $ty:ty),+ $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
        pub(crate) struct $name {
            $(pub(crate) $field: $ty),+
        }

        impl KernelParams for $name {
            const SHADERS: &'static [Shader] = &[$(Shader::$shader),+];
        }

        #[cfg(test)]
        impl $name {
            fn layout() -> Layout {
                Layout {
                    name: stringify!($name),
                    shaders: <$name as KernelParams>::SHADERS,
                    size: std::mem::size_of::<$name>(),
                    members: vec![$((stringify!($field), std::mem::offset_of!($name, $field))),+],
                }
            }
        }
    };
}

params!(
    /// `read_probe.wgsl`: vec4s each invocation reads per run.
    ReadProbeParams for [ReadProbe] { per_lane: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
);
params!(
    /// `elementwise.wgsl`: unary, binary and scale ops.
    ElementwiseParams for [Elementwise] { len: u32, rhs_len: u32, factor: f32, _pad: u32 }
);
params!(
    /// `norm.wgsl`: RMS and layer norm.
    NormParams for [Norm] { rows: u32, cols: u32, eps: f32, _pad: u32 }
);
params!(
    /// `softmax.wgsl`; `causal_q` 0 means no mask.
    SoftmaxParams for [Softmax] { rows: u32, cols: u32, causal_q: u32, _pad: u32 }
);
params!(
    /// `rope.wgsl`.
    RopeParams for [Rope] { rows: u32, heads: u32, head_dim: u32, interleaved: u32 }
);
params!(
    /// `matmul.wgsl`: the tiled product, one dispatch per window of tiles and batches.
    MatmulParams for [Matmul] {
        m: u32, n: u32, k: u32, rhs_transposed: u32, rhs_stride: u32, tile_x0: u32,
        tile_y0: u32, batch0: u32,
    }
);
params!(
    /// `matvec.wgsl`: f32 products of m ≤ 4 rows (any m for `mv` on CPU adapters, in `chunks`
    /// of four rows).
    MatvecParams for [Matvec] {
        m: u32, n: u32, k: u32, rhs_stride: u32, col_group0: u32, batch0: u32, chunks: u32,
        _pad1: u32,
    }
);
params!(
    /// `embedding.wgsl`: the gather from table rows `first..first + rows`.
    EmbeddingParams for [Embedding] {
        vocab: u32, dim: u32, count: u32, first: u32, rows: u32, _pad0: u32, _pad1: u32,
        _pad2: u32,
    }
);
params!(
    /// `permute.wgsl`: up to 8 dimensions, as two `vec4<u32>` each for the shape and strides.
    PermuteParams for [Permute] {
        len: u32, rank: u32, _pad0: u32, _pad1: u32, shape: [u32; 8], strides: [u32; 8],
    }
);
params!(
    /// `argmax.wgsl`.
    ArgmaxParams for [Argmax] { rows: u32, cols: u32, _pad0: u32, _pad1: u32 }
);
params!(
    /// `shaders/quant/` and `quant_f16.wgsl`; `format` is a `FMT_*` code, `zero` always 0,
    /// `residual` 1 when the `mv` product adds its residual operand.
    QuantParams for [Quant, QuantF16] {
        format: u32, m: u32, n: u32, k: u32, mode: u32, zero: u32, epilogue: u32, eps: f32,
        rope_dim: u32, store_dim: u32, pool_rows: u32, second_at: u32, values_at: u32,
        _pad0: u32, _pad1: u32, _pad2: u32,
    }
);
params!(
    /// `scan.wgsl`.
    ScanParams for [Scan] {
        op: u32, outer: u32, len: u32, inner: u32, chunks: u32, _pad0: u32, _pad1: u32,
        _pad2: u32,
    }
);
params!(
    /// `concat.wgsl`: concat, narrow (`a_cols` = row width, `b_cols` = start) and scatter_rows
    /// (`a_cols` = row width, `b_cols` = target rows).
    ConcatParams for [Concat] { len: u32, a_cols: u32, b_cols: u32, width: u32 }
);
params!(
    /// `sample.wgsl`.
    SampleParams for [Sample] {
        rows: u32, vocab: u32, temperature: f32, top_k: u32, top_p: f32, chunks: u32,
        _pad0: u32, _pad1: u32,
    }
);
params!(
    /// `attention.wgsl`: attention over a paged KV pool; `window` 0 means full causal,
    /// `softcap` 0 no soft-capping.
    AttentionParams for [Attention] {
        t: u32, n: u32, heads: u32, kv_heads: u32, head_dim: u32, pool_rows: u32, scale: f32,
        window: u32, stride: u32, chunks: u32, keys_from: u32, values_from: u32, softcap: f32,
        _pad0: u32, _pad1: u32, _pad2: u32,
    }
);

#[cfg(test)]
struct Layout {
    name: &'static str,
    shaders: &'static [Shader],
    size: usize,
    members: Vec<(&'static str, usize)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::webgpu::context::MvShape;

    fn layouts() -> Vec<Layout> {
        vec![
            ElementwiseParams::layout(),
            NormParams::layout(),
            SoftmaxParams::layout(),
            RopeParams::layout(),
            MatmulParams::layout(),
            MatvecParams::layout(),
            EmbeddingParams::layout(),
            PermuteParams::layout(),
            ArgmaxParams::layout(),
            QuantParams::layout(),
            ScanParams::layout(),
            ConcatParams::layout(),
            SampleParams::layout(),
            AttentionParams::layout(),
            ReadProbeParams::layout(),
        ]
    }

    /// naga's layout of the `Params` struct of `source`: size and (name, offset) members.
    fn reflect(shader: Shader, source: &str) -> (u32, Vec<(String, u32)>) {
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{shader:?}: {}", e.emit_to_string(source)));
        let (_, ty) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some("Params"))
            .unwrap_or_else(|| panic!("{shader:?} declares no Params"));
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            panic!("{shader:?}: Params is not a struct");
        };
        let members = members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset))
            .collect();
        (*span, members)
    }

    /// Compares one Rust layout with naga's reflection of one shader; the differences.
    fn mismatches(layout: &Layout, shader: Shader) -> Vec<String> {
        let source = shader.composed(MvShape::Lanes, false);
        let (size, members) = reflect(shader, &source);
        let mut out = Vec::new();
        if size as usize != layout.size {
            out.push(format!(
                "{shader:?}: Params is {size} bytes, {} is {}",
                layout.name, layout.size
            ));
        }
        let rust: Vec<(String, u32)> = layout
            .members
            .iter()
            .map(|(n, o)| (n.to_string(), *o as u32))
            .collect();
        if rust != members {
            out.push(format!(
                "{shader:?}: WGSL members {members:?}, {} has {rust:?}",
                layout.name
            ));
        }
        out
    }

    #[test]
    fn every_wgsl_params_matches_its_rust_struct() {
        let layouts = layouts();
        let mut errors = Vec::new();
        for shader in Shader::ALL {
            let owners: Vec<&Layout> = layouts
                .iter()
                .filter(|l| l.shaders.contains(&shader))
                .collect();
            assert_eq!(
                owners.len(),
                1,
                "{shader:?} needs exactly one Params struct"
            );
            errors.extend(mismatches(owners[0], shader));
            assert!(owners[0].size as u64 <= super::super::pipelines::PARAMS_BYTES);
        }
        assert!(errors.is_empty(), "{}", errors.join("\n"));
    }

    /// The check can fail: a struct with a member out of place, against the elementwise shader.
    #[test]
    fn a_mismatched_layout_is_reported() {
        let mut wrong = ElementwiseParams::layout();
        wrong.members.swap(0, 1);
        assert_eq!(mismatches(&wrong, Shader::Elementwise).len(), 1);
        wrong.size += 4;
        assert_eq!(mismatches(&wrong, Shader::Elementwise).len(), 2);
    }
}
