//! Shader modules, bind group layouts and compute pipelines, each created once.
//!
//! Every webtensor shader uses one binding convention: binding 0 is the op's parameter block
//! (a uniform buffer with a dynamic offset into the per-batch parameter arena), binding 1 is
//! the output (read-write storage), and bindings 2.. are the inputs (read-only storage), in
//! [`crate::backend::OpSpec`] order. So one bind group layout per input count (1 to 3) serves
//! every kernel, and pipelines are cached by (shader, entry point).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Mutex;

use super::context::{GpuContext, MvShape};
use crate::backend::kernel_consts::WGSL_PRELUDE;
use crate::backend::BackendKind;
use crate::error::{Error, Result};

/// Bytes of one parameter block as bound; every WGSL `Params` struct fits in it.
pub(crate) const PARAMS_BYTES: u64 = 256;

/// The most inputs an op binds.
pub(crate) const MAX_INPUTS: usize = 6;

/// The storage inputs of the one layout that also binds a texture, which follows them
/// (binding `2 + TEXTURE_INPUTS`): `mv_pairs_texels` and `mv_texels` bind `mv`'s six and
/// the texel scales.
/// With the output that is eight storage buffers, WebGPU's default per-stage limit.
pub(crate) const TEXTURE_INPUTS: usize = 7;

/// `sin_cos` of rotary angles, for `rope.wgsl` and the `quant` module's rotary epilogue.
const ROTARY_PRELUDE: &str = include_str!("../../../shaders/rotary/sin_cos.wgsl");

/// The K-quant super-blocks decoded a group at a time, for the `quant` module's products.
const KQUANTS_PRELUDE: &str = include_str!("../../../shaders/kquants/decode.wgsl");

/// The quantized-data module, one file per purpose under `shaders/quant/` (the shared header
/// and formats, conversions, products, the software adapters' decode shapes, prefill tiles),
/// compiled as one module in this order.
const QUANT_MODULE: &str = concat!(
    include_str!("../../../shaders/quant/common.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/convert.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/products.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/cpu_adapters.wgsl"),
    "\n",
    include_str!("../../../shaders/quant/tiled.wgsl"),
);

/// One `.wgsl` module of `shaders/`: a file, or for `Quant` the files of `shaders/quant/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Shader {
    Elementwise,
    Norm,
    Softmax,
    Rope,
    Matmul,
    Matvec,
    Embedding,
    Permute,
    Argmax,
    Quant,
    QuantF16,
    Scan,
    Concat,
    Sample,
    Attention,
    ReadProbe,
}

/// The prelude of the shaders marked `@prelude(dot4)`: `idot4` through WGSL's
/// `dot4I8Packed` (`builtin`) or written out.
fn dot4_prelude(builtin: bool) -> &'static str {
    if builtin {
        include_str!("../../../shaders/dot4/builtin.wgsl")
    } else {
        include_str!("../../../shaders/dot4/portable.wgsl")
    }
}

/// The prelude of the shaders marked `@prelude(reduce)`: the entry `mv` for a shape, with the
/// subgroup teams' rows per workgroup written into its `MV_ROWS`.
fn reduce_prelude(shape: MvShape) -> String {
    match shape {
        MvShape::Lanes => include_str!("../../../shaders/reduce/lanes.wgsl").into(),
        MvShape::SubgroupTeams { rows } => include_str!("../../../shaders/reduce/subgroup.wgsl")
            .replace(SUBGROUP_MV_ROWS, &format!("const MV_ROWS: u32 = {rows}u;")),
        MvShape::WorkgroupTeams => include_str!("../../../shaders/reduce/workgroup.wgsl").into(),
    }
}

/// The declaration in `subgroup.wgsl` that [`reduce_prelude`] replaces.
const SUBGROUP_MV_ROWS: &str = "const MV_ROWS: u32 = 32u;";

impl Shader {
    pub(crate) const ALL: [Shader; 16] = [
        Shader::Elementwise,
        Shader::Norm,
        Shader::Softmax,
        Shader::Rope,
        Shader::Matmul,
        Shader::Matvec,
        Shader::Embedding,
        Shader::Permute,
        Shader::Argmax,
        Shader::Quant,
        Shader::QuantF16,
        Shader::Scan,
        Shader::Concat,
        Shader::Sample,
        Shader::Attention,
        Shader::ReadProbe,
    ];

    /// The module's WGSL for the adapter's matvec shape and integer dot (see
    /// [`Shader::composed`]).
    fn module_source(self, ctx: &GpuContext) -> String {
        self.composed(ctx.mv_shape(), ctx.int_dot)
    }

    /// The module's WGSL (see [`compose_module`]), with the preludes of the shaders that use
    /// them: the reduction prelude of `shape`, and `idot4` through `dot4I8Packed` when
    /// `int_dot`, else written out.
    pub(crate) fn composed(self, shape: MvShape, int_dot: bool) -> String {
        let preludes = match self {
            Shader::Matvec => vec![reduce_prelude(shape)],
            Shader::Quant => vec![
                reduce_prelude(shape),
                dot4_prelude(int_dot).into(),
                ROTARY_PRELUDE.into(),
                KQUANTS_PRELUDE.into(),
            ],
            Shader::Rope => vec![ROTARY_PRELUDE.into()],
            _ => vec![],
        };
        let preludes: Vec<&str> = preludes.iter().map(String::as_str).collect();
        compose_module(self.source(), &preludes)
    }

    /// The name of the pipeline constant a kernel's `format` sets (see [`Pipelines::kernel`]):
    /// `LANE_HEADS` of `attention.wgsl` (the heads a `paged_attention_lanes` lane takes),
    /// `MV_FORMAT` elsewhere (the weight format of the kernels specialised per format).
    pub(crate) fn constant(self) -> &'static str {
        match self {
            Shader::Attention => "LANE_HEADS",
            _ => "MV_FORMAT",
        }
    }

    pub(crate) fn source(self) -> &'static str {
        match self {
            Shader::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            Shader::Norm => include_str!("../../../shaders/norm.wgsl"),
            Shader::Softmax => include_str!("../../../shaders/softmax.wgsl"),
            Shader::Rope => include_str!("../../../shaders/rope.wgsl"),
            Shader::Matmul => include_str!("../../../shaders/matmul.wgsl"),
            Shader::Matvec => include_str!("../../../shaders/matvec.wgsl"),
            Shader::Embedding => include_str!("../../../shaders/embedding.wgsl"),
            Shader::Permute => include_str!("../../../shaders/permute.wgsl"),
            Shader::Argmax => include_str!("../../../shaders/argmax.wgsl"),
            Shader::Quant => QUANT_MODULE,
            Shader::QuantF16 => include_str!("../../../shaders/quant_f16.wgsl"),
            Shader::Scan => include_str!("../../../shaders/scan.wgsl"),
            Shader::Concat => include_str!("../../../shaders/concat.wgsl"),
            Shader::Sample => include_str!("../../../shaders/sample.wgsl"),
            Shader::Attention => include_str!("../../../shaders/attention.wgsl"),
            Shader::ReadProbe => include_str!("../../../shaders/read_probe.wgsl"),
        }
    }

    /// The module's name: its file's, e.g. `norm.wgsl`, or `quant` for the files of
    /// `shaders/quant/`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shader::Elementwise => "elementwise.wgsl",
            Shader::Norm => "norm.wgsl",
            Shader::Softmax => "softmax.wgsl",
            Shader::Rope => "rope.wgsl",
            Shader::Matmul => "matmul.wgsl",
            Shader::Matvec => "matvec.wgsl",
            Shader::Embedding => "embedding.wgsl",
            Shader::Permute => "permute.wgsl",
            Shader::Argmax => "argmax.wgsl",
            Shader::Quant => "quant",
            Shader::QuantF16 => "quant_f16.wgsl",
            Shader::Scan => "scan.wgsl",
            Shader::Concat => "concat.wgsl",
            Shader::Sample => "sample.wgsl",
            Shader::Attention => "attention.wgsl",
            Shader::ReadProbe => "read_probe.wgsl",
        }
    }
}

/// The WGSL compiled for a shader file: its `enable` directives (which WGSL wants before any
/// declaration), the constants prelude `shaders/generated/formats.wgsl`, the `preludes` the
/// file's `@prelude` lines ask for, then the rest of the file. Public for
/// `native-tests/shaders.rs`, which validates every file as the backend composes it.
#[doc(hidden)]
pub fn compose_module(file: &str, preludes: &[&str]) -> String {
    let (enables, rest): (Vec<&str>, Vec<&str>) = file
        .lines()
        .partition(|l| l.trim_start().starts_with("enable "));
    let mut out = String::new();
    for line in enables {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(WGSL_PRELUDE);
    for prelude in preludes {
        out.push('\n');
        out.push_str(prelude);
    }
    out.push('\n');
    out.push_str(&rest.join("\n"));
    out
}

/// Every WGSL module the backend compiles, as (name, source before [`compose_module`]): public
/// for `native-tests/shaders.rs`, which validates each as the backend composes it.
#[doc(hidden)]
pub fn shader_modules() -> Vec<(&'static str, &'static str)> {
    Shader::ALL.iter().map(|s| (s.name(), s.source())).collect()
}

/// A hash of every shader source and prelude: a self-check verdict cached on disk holds only
/// for the kernels it checked.
pub(crate) fn sources_fingerprint() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    WGSL_PRELUDE.hash(&mut h);
    for shader in Shader::ALL {
        shader.source().hash(&mut h);
    }
    for shape in [
        MvShape::Lanes,
        MvShape::SubgroupTeams { rows: 32 },
        MvShape::WorkgroupTeams,
    ] {
        reduce_prelude(shape).hash(&mut h);
    }
    for builtin in [true, false] {
        dot4_prelude(builtin).hash(&mut h);
    }
    ROTARY_PRELUDE.hash(&mut h);
    KQUANTS_PRELUDE.hash(&mut h);
    h.finish()
}

/// A compiled kernel and the bind group layout it was compiled against.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    pub(crate) pipeline: wgpu::ComputePipeline,
    /// Its bind group layout: binding 0 the parameters, 1 the output, then `inputs` storage
    /// inputs and, for a kernel compiled to bind one, a `texture_2d<u32>`.
    pub(crate) layout: wgpu::BindGroupLayout,
    pub(crate) inputs: usize,
    /// Which kernel this is, for the profiler.
    pub(crate) id: KernelId,
}

/// A kernel's name: its shader file, entry point and pipeline constant (the key of the
/// pipeline cache). Copied per dispatch by the profiler, and spelled out only when a profile
/// is read ([`KernelId::label`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KernelId {
    pub(crate) shader: Shader,
    pub(crate) entry: &'static str,
    pub(crate) format: u32,
}

impl KernelId {
    /// `file::entry`, with the weight format and activation path of a kernel specialised by
    /// `MV_FORMAT` in brackets, e.g. `quant::mv[q4_0 int8]`.
    pub(crate) fn label(self) -> String {
        use crate::backend::kernel_consts::{
            INT_ACTIVATIONS, PACKED_FORMATS, QUANTIZE_ACTIVATIONS,
        };
        let name = format!("{}::{}", self.shader.name(), self.entry);
        if self.format == 0 {
            return name;
        }
        if self.shader == Shader::Attention {
            return format!("{name}[{} heads a lane]", self.format);
        }
        let code = self.format & (INT_ACTIVATIONS - 1);
        let weights = PACKED_FORMATS
            .iter()
            .find(|f| f.code == code)
            .map_or_else(|| format!("format {code}"), |f| f.dtype.to_string());
        let activations = if self.format & QUANTIZE_ACTIVATIONS != 0 {
            " int8, rounded in-kernel"
        } else if self.format & INT_ACTIVATIONS != 0 {
            " int8"
        } else {
            ""
        };
        format!("{name}[{weights}{activations}]")
    }
}

/// The caches.
#[derive(Debug)]
pub(crate) struct Pipelines {
    /// Bind group layout for `i + 1` inputs.
    layouts: Vec<wgpu::BindGroupLayout>,
    pipeline_layouts: Vec<wgpu::PipelineLayout>,
    /// The layout with [`TEXTURE_INPUTS`] inputs and a texture.
    texture_layout: (wgpu::BindGroupLayout, wgpu::PipelineLayout),
    modules: Mutex<HashMap<Shader, wgpu::ShaderModule>>,
    kernels: Mutex<HashMap<KernelId, Kernel>>,
}

impl Pipelines {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        let (layouts, pipeline_layouts) = (1..=MAX_INPUTS)
            .map(|inputs| bind_layout(device, inputs, false))
            .unzip();
        Pipelines {
            layouts,
            pipeline_layouts,
            texture_layout: bind_layout(device, TEXTURE_INPUTS, true),
            modules: Mutex::new(HashMap::new()),
            kernels: Mutex::new(HashMap::new()),
        }
    }

    /// The pipeline for `entry` of `shader`, which binds `inputs` inputs (and with `texture` a
    /// texture after [`TEXTURE_INPUTS`] of them); compiled on first use. `format` is the
    /// pipeline constant ([`Shader::constant`]): `MV_FORMAT` of the kernels specialised per
    /// weight format, `LANE_HEADS` of attention's lanes kernel (0 for every other kernel: the
    /// constant keeps its default).
    pub(crate) fn kernel(
        &self,
        ctx: &GpuContext,
        shader: Shader,
        entry: &'static str,
        (inputs, texture): (usize, bool),
        format: u32,
    ) -> Result<Kernel> {
        let poisoned = || Error::backend(BackendKind::Wgpu, "a pipeline cache lock was poisoned");
        let id = KernelId {
            shader,
            entry,
            format,
        };
        let mut kernels = self.kernels.lock().map_err(|_| poisoned())?;
        if let Some(k) = kernels.get(&id) {
            return Ok(k.clone());
        }
        let module = {
            let mut modules = self.modules.lock().map_err(|_| poisoned())?;
            modules
                .entry(shader)
                .or_insert_with(|| {
                    ctx.device
                        .create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(shader.name()),
                            source: wgpu::ShaderSource::Wgsl(shader.module_source(ctx).into()),
                        })
                })
                .clone()
        };
        if texture && inputs != TEXTURE_INPUTS {
            return Err(Error::backend(
                BackendKind::Wgpu,
                format!("{entry}: a kernel with a texture binds {TEXTURE_INPUTS} inputs"),
            ));
        }
        let (inputs, (layout, pipeline_layout)) = if texture {
            (inputs, (&self.texture_layout.0, &self.texture_layout.1))
        } else {
            let inputs = inputs.clamp(1, MAX_INPUTS);
            let i = inputs - 1;
            (inputs, (&self.layouts[i], &self.pipeline_layouts[i]))
        };
        let constants = [(shader.constant(), f64::from(format))];
        let constants: &[(&str, f64)] = if format == 0 { &[] } else { &constants };
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    // Every kernel writes its workgroup memory before reading it.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(e) = ctx.errors.take() {
            return Err(Error::backend(
                BackendKind::Wgpu,
                format!("compiling {}::{entry} failed: {e}", shader.name()),
            ));
        }
        let kernel = Kernel {
            pipeline,
            layout: layout.clone(),
            inputs,
            id,
        };
        kernels.insert(id, kernel.clone());
        Ok(kernel)
    }
}

/// The bind group layout (and pipeline layout) of a kernel binding `inputs` storage inputs
/// and, with `texture`, a `texture_2d<u32>` after them.
fn bind_layout(
    device: &wgpu::Device,
    inputs: usize,
    texture: bool,
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let mut entries = vec![
        wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: NonZeroU64::new(PARAMS_BYTES),
            },
            count: None,
        },
        storage_entry(1, false),
    ];
    entries.extend((0..inputs).map(|i| storage_entry(2 + i as u32, true)));
    if texture {
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: 2 + inputs as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Texture {
                sample_type: wgpu::TextureSampleType::Uint,
                view_dimension: wgpu::TextureViewDimension::D2,
                multisampled: false,
            },
            count: None,
        });
    }
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("webtensor bind group layout"),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("webtensor pipeline layout"),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    (layout, pipeline_layout)
}

fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{reduce_prelude, MvShape, Shader};
    use crate::backend::webgpu::context::subgroup_team_rows;

    /// Every shader validates with naga as the backend composes it for each shape it can pick:
    /// the subgroup teams at every row count `subgroup_team_rows` gives (so a declaration
    /// sized by a prelude's `MV_ROWS` is checked at 4 rows too, not only at the file's 32),
    /// with either `idot4` prelude. `native-tests/shaders.rs` checks the files as written.
    #[test]
    fn every_composition_validates() {
        let mut shapes = vec![MvShape::Lanes, MvShape::WorkgroupTeams];
        for size in [0, 2, 4, 8, 16, 32, 64, 128] {
            shapes.push(MvShape::SubgroupTeams {
                rows: subgroup_team_rows(size),
            });
        }
        for shape in shapes {
            for int_dot in [true, false] {
                for shader in Shader::ALL {
                    let source = shader.composed(shape, int_dot);
                    let what = format!("{shader:?} for {shape:?}, int_dot {int_dot}");
                    let module = naga::front::wgsl::parse_str(&source)
                        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
                    naga::valid::Validator::new(
                        naga::valid::ValidationFlags::all(),
                        naga::valid::Capabilities::all(),
                    )
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
                    for ep in &module.entry_points {
                        assert!(
                            ep.workgroup_size.iter().all(|&n| n > 0),
                            "{what}: entry {} has workgroup size {:?}",
                            ep.name,
                            ep.workgroup_size
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn subgroup_teams_get_four_rows_per_subgroup() {
        assert_eq!(subgroup_team_rows(32), 8);
        assert_eq!(subgroup_team_rows(64), 4);
        assert_eq!(subgroup_team_rows(16), 16);
        assert_eq!(subgroup_team_rows(128), 4);
        assert_eq!(subgroup_team_rows(0), 32);
    }

    #[test]
    fn the_subgroup_prelude_takes_the_rows_per_workgroup() {
        let wgsl = reduce_prelude(MvShape::SubgroupTeams { rows: 8 });
        assert!(wgsl.contains("const MV_ROWS: u32 = 8u;"), "{wgsl}");
        assert!(!wgsl.contains("const MV_ROWS: u32 = 32u;"));
    }
}
