//! Starting wgpu: instance, adapter, device and queue, and what they report.
//!
//! The instance honours `WGPU_BACKEND` (e.g. `WGPU_BACKEND=vulkan`) and the adapter request
//! honours `WGPU_POWER_PREF`, defaulting to high performance. The device is requested with the
//! adapter's own limits, so the limits the backend checks against (largest storage binding,
//! workgroups per dimension) are the hardware's, not WebGPU's conservative defaults.

use std::sync::{Arc, Mutex};

use super::selfcheck::Verdict;
use crate::backend::options::MIN_MAX_BINDING;
use crate::backend::{BackendInfo, BackendKind, DeviceClass, Switch, WgpuOptions};

/// What kind of error wgpu reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum GpuFault {
    /// A validation error (a bug in webtensor, or a limit it did not check).
    Validation,
    /// An allocation the device could not satisfy.
    OutOfMemory,
    /// The device was lost (driver reset, GPU removed, out of memory on some platforms).
    Lost,
}

/// Errors wgpu reports asynchronously (validation, out of memory, device loss), collected so
/// they surface as typed errors at the next call instead of wgpu's default handler, which
/// panics.
#[derive(Clone, Debug, Default)]
pub(crate) struct ErrorSink(Arc<Mutex<Vec<(GpuFault, String)>>>);

impl ErrorSink {
    fn push(&self, fault: GpuFault, message: String) {
        if let Ok(mut list) = self.0.lock() {
            list.push((fault, message));
        }
    }

    /// The errors collected since the last call: the gravest kind and its messages joined,
    /// or `None` when there were none. Lesser errors are left out of the message: they follow
    /// from the grave one (a buffer the driver could not back is "invalid" in every later
    /// bind group). A loss is kept: a lost device stays lost, so every later call reports it
    /// again.
    pub(crate) fn take_fault(&self) -> Option<(GpuFault, String)> {
        let mut list = self.0.lock().ok()?;
        let fault = list.iter().map(|(f, _)| *f).max()?;
        let joined = list
            .iter()
            .filter(|(f, _)| *f == fault)
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        list.retain(|(f, _)| *f == GpuFault::Lost);
        Some((fault, joined))
    }

    /// The gravest errors collected since the last call, joined, or `None` when there were none.
    pub(crate) fn take(&self) -> Option<String> {
        self.take_fault().map(|(_, m)| m)
    }
}

/// The device and what the backend needs to know about it.
#[derive(Debug)]
pub(crate) struct GpuContext {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) adapter_info: wgpu::AdapterInfo,
    /// The adapter's optional features (what `info` reports).
    pub(crate) adapter_features: wgpu::Features,
    /// The device's limits: the adapter's own.
    pub(crate) limits: wgpu::Limits,
    pub(crate) errors: ErrorSink,
    /// The options the backend was started with.
    pub(crate) options: WgpuOptions,
    /// Whether f16 kernels use the `shader-f16` WGSL extension (present on the device and not
    /// turned off with [`WgpuOptions::shader_f16`]) rather than `unpack2x16float` on u32
    /// storage.
    pub(crate) native_f16: bool,
    /// Whether the row-dot kernels (`mv`) split each row across a team of lanes (GPUs) or give
    /// each lane whole rows (adapters that run shaders on CPU cores); [`WgpuOptions::row_teams`]
    /// forces either.
    pub(crate) row_teams: bool,
    /// Whether row teams reduce with `subgroupAdd`: the device has subgroups and
    /// [`WgpuOptions::subgroups`] does not turn them off. Otherwise through workgroup memory.
    pub(crate) subgroups: bool,
    /// Whether the int8-activation products take their 4-byte dot products with WGSL's
    /// `dot4I8Packed` (`shaders/dot4/builtin.wgsl`): the platform offers the
    /// packed_4x8_integer_dot_product language feature and [`WgpuOptions::int_dot`] does not
    /// turn it off. Otherwise `shaders/dot4/portable.wgsl` writes them out.
    pub(crate) int_dot: bool,
    /// Whether prefill products with packed weights may run the tiled kernel `mm_tiled` on
    /// GPUs ([`WgpuOptions::tiled_prefill`] does not turn it off).
    pub(crate) tiled_prefill: bool,
    /// Whether uploaded Q4_0 tensors also get a texel copy for the decode products
    /// (`texels.rs`): on the lanes shape, unless [`WgpuOptions::weight_texels`] turns it off.
    pub(crate) weight_texels: bool,
    /// The self-check's verdicts on the variants, where they ran.
    pub(crate) subgroups_check: Option<Verdict>,
    pub(crate) f16_check: Option<Verdict>,
    pub(crate) int_dot_check: Option<Verdict>,
    pub(crate) tiled_prefill_check: Option<Verdict>,
    /// Whether dispatches are timed ([`WgpuOptions::profile`]).
    pub(crate) profiling: Profiling,
}

/// Whether the backend times each dispatch with timestamp queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Profiling {
    /// Not asked for ([`WgpuOptions::profile`] off): no query sets, no readbacks.
    Off,
    /// Asked for, and the device has `timestamp-query`.
    On,
    /// Asked for but not possible here, and why.
    Unavailable(String),
}

/// How the row-dot kernels (`mv` in `matvec.wgsl` and `shaders/quant/`) split their work: the
/// prelude of `shaders/reduce/` they are compiled after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MvShape {
    /// One lane per four rows (eight Q4_0 rows in `mv_pairs_lanes`), no reduction (`lanes.wgsl`).
    Lanes,
    /// A subgroup per four rows, reduced with `subgroupAdd` (`subgroup.wgsl`); `rows` output
    /// rows per 64-thread workgroup, four per subgroup it holds, so that every subgroup has
    /// rows and a matrix of n rows spreads over n / rows workgroups (a GPU needs many: with 32
    /// rows per workgroup a 2048-row product left most of an H200's 132 SMs idle).
    SubgroupTeams { rows: u32 },
    /// Eight lanes per four rows, reduced through workgroup memory (`workgroup.wgsl`).
    WorkgroupTeams,
}

impl MvShape {
    /// Output rows per workgroup (`MV_ROWS` of the prelude).
    pub(crate) fn rows_per_workgroup(self) -> usize {
        match self {
            MvShape::Lanes => 64,
            MvShape::SubgroupTeams { rows } => rows as usize,
            MvShape::WorkgroupTeams => 32,
        }
    }

    /// The largest k the shape takes: one lane walking a whole row runs about 60 loop
    /// iterations per 32 values, and lavapipe ends shader loops after 65,535 iterations.
    pub(crate) fn max_k(self) -> usize {
        match self {
            MvShape::Lanes => 16384,
            MvShape::SubgroupTeams { .. } | MvShape::WorkgroupTeams => usize::MAX,
        }
    }
}

/// Output rows per 64-thread workgroup of the subgroup teams: four per subgroup of the
/// adapter's largest subgroup size (a smaller one leaves some subgroups without rows, which
/// is correct, only less parallel). 32 where the adapter reports no size.
pub(crate) fn subgroup_team_rows(max_subgroup_size: u32) -> u32 {
    match max_subgroup_size {
        0 => 32,
        size => 4 * (64 / size.clamp(2, 64)),
    }
}

impl GpuContext {
    /// Finds an adapter and opens a device on it with `options`. `Err` says why in words.
    pub(crate) async fn new(options: &WgpuOptions) -> std::result::Result<Self, String> {
        if let Some(cap) = options.max_binding.filter(|&c| c < MIN_MAX_BINDING) {
            return Err(format!(
                "the option wgpu.max_binding = {cap}: expected a number of bytes ≥ {MIN_MAX_BINDING}"
            ));
        }
        let instance = wgpu::Instance::new(instance_descriptor());
        let power_preference =
            wgpu::PowerPreference::from_env().unwrap_or(wgpu::PowerPreference::HighPerformance);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| {
                if cfg!(target_arch = "wasm32") {
                    format!(
                        "this browser offers no WebGPU adapter ({e}); WebGPU needs a recent \
                         Chrome, Edge or Safari, or Firefox with WebGPU enabled"
                    )
                } else {
                    format!(
                        "no GPU adapter found ({e}); on Linux install mesa-vulkan-drivers for a \
                         software Vulkan device"
                    )
                }
            })?;
        let adapter_info = adapter.get_info();
        // In the browser wgpu leaves the name empty: take it from the page's GPUAdapterInfo.
        #[cfg(target_arch = "wasm32")]
        let adapter_info = super::browser::name_adapter(adapter_info, power_preference).await;
        let adapter_features = adapter.features();
        // f16 and subgroups are enabled where present so later kernels can use them; nothing
        // requires them.
        let mut enabled =
            adapter_features & (wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
        let profiling = profiling(options.profile, adapter_features);
        if profiling == Profiling::On {
            enabled |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("webtensor"),
                required_features: enabled,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("the adapter {} refused a device: {e}", adapter_info.name))?;

        let errors = ErrorSink::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let fault = match e {
                wgpu::Error::OutOfMemory { .. } => GpuFault::OutOfMemory,
                _ => GpuFault::Validation,
            };
            sink.push(fault, e.to_string())
        }));
        let sink = errors.clone();
        // The backend lives as long as the process and never destroys its device itself, so
        // `Destroyed` also means lost (`Backend::lose_device` in the tests).
        device.set_device_lost_callback(move |reason, message| {
            let message = match reason {
                wgpu::DeviceLostReason::Destroyed => format!("device destroyed {message}"),
                wgpu::DeviceLostReason::Unknown => format!("device lost: {message}"),
            };
            sink.push(GpuFault::Lost, message.trim_end().to_string());
        });
        let mut limits = device.limits();
        if let Some(cap) = options.max_binding {
            limits.max_storage_buffer_binding_size =
                limits.max_storage_buffer_binding_size.min(cap);
        }
        let native_f16 = enabled.contains(wgpu::Features::SHADER_F16) && options.shader_f16;
        let subgroups = enabled.contains(wgpu::Features::SUBGROUP) && options.subgroups;
        let int_dot = instance
            .wgsl_language_features()
            .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct)
            && options.int_dot;
        let tiled_prefill = options.tiled_prefill;
        let row_teams = match options.row_teams {
            Switch::On => true,
            Switch::Off => false,
            Switch::Auto => matches!(
                device_class(&adapter_info),
                DeviceClass::Gpu | DeviceClass::Noop
            ),
        };
        Ok(GpuContext {
            device,
            queue,
            adapter_info,
            adapter_features,
            limits,
            errors,
            options: options.clone(),
            native_f16,
            row_teams,
            subgroups,
            int_dot,
            tiled_prefill,
            weight_texels: !row_teams && options.weight_texels,
            subgroups_check: None,
            f16_check: None,
            int_dot_check: None,
            tiled_prefill_check: None,
            profiling,
        })
    }

    /// The shape of the row-dot kernels on this device.
    pub(crate) fn mv_shape(&self) -> MvShape {
        match (self.row_teams, self.subgroups) {
            (false, _) => MvShape::Lanes,
            (true, true) => MvShape::SubgroupTeams {
                rows: subgroup_team_rows(self.adapter_info.subgroup_max_size),
            },
            (true, false) => MvShape::WorkgroupTeams,
        }
    }

    /// The largest buffer one storage binding can cover, and the name of the limit that sets
    /// it (the smaller of the binding limit and the buffer-size limit).
    pub(crate) fn max_binding(&self) -> (u64, &'static str) {
        let binding = self.limits.max_storage_buffer_binding_size;
        let buffer = self.limits.max_buffer_size;
        if buffer < binding {
            (buffer, "max_buffer_size")
        } else {
            (binding, "max_storage_buffer_binding_size")
        }
    }

    /// Identity, features and limits, for `webtensor info` and `Device::auto`.
    pub(crate) fn info(&self) -> BackendInfo {
        // How prefill products run without the tiles.
        const ROW_DOT: &str = "the row-dot kernel, four activation rows per pass over the weights";
        let a = &self.adapter_info;
        let driver = match (a.driver.is_empty(), a.driver_info.is_empty()) {
            (false, false) => format!("{} {}", a.driver, a.driver_info),
            (false, true) => a.driver.clone(),
            (true, false) => a.driver_info.clone(),
            (true, true) => String::new(),
        };
        let mut features = Vec::new();
        for (flag, name) in [
            (wgpu::Features::SHADER_F16, "shader-f16"),
            (wgpu::Features::SUBGROUP, "subgroups"),
            (wgpu::Features::TIMESTAMP_QUERY, "timestamp-query"),
        ] {
            if self.adapter_features.contains(flag) {
                features.push(name.to_string());
            }
        }
        // A WGSL language feature rather than a device one, named as WGSL spells its builtin,
        // with the self-check's verdict.
        if self.int_dot || self.int_dot_check.is_some() {
            features.push(with_note("dot4I8Packed".into(), &self.int_dot_check));
        }
        let l = &self.limits;
        let limits = [
            (
                "max_storage_buffer_binding_size",
                l.max_storage_buffer_binding_size,
            ),
            ("max_buffer_size", l.max_buffer_size),
            (
                "max_compute_workgroup_size_x",
                l.max_compute_workgroup_size_x as u64,
            ),
            (
                "max_compute_invocations_per_workgroup",
                l.max_compute_invocations_per_workgroup as u64,
            ),
            (
                "max_compute_workgroups_per_dimension",
                l.max_compute_workgroups_per_dimension as u64,
            ),
            (
                "max_compute_workgroup_storage_size",
                l.max_compute_workgroup_storage_size as u64,
            ),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect();
        BackendInfo {
            kind: BackendKind::Wgpu,
            class: device_class(a),
            device_name: a.name.clone(),
            vendor: vendor_name(a.vendor),
            driver,
            api: api_name(a.backend).to_string(),
            features,
            limits,
            threads: None,
            simd: None,
            missing_ops: vec![],
            f16_path: with_note(
                if self.native_f16 {
                    "shader-f16 (native f16 storage)".into()
                } else if matches!(self.f16_check, Some(Verdict::Demoted(_))) {
                    "unpack2x16float on u32 storage".into()
                } else if self.adapter_features.contains(wgpu::Features::SHADER_F16) {
                    "unpack2x16float on u32 storage (option wgpu.shader_f16 = false)".into()
                } else {
                    "unpack2x16float on u32 storage (no shader-f16 on this adapter)".into()
                },
                &self.f16_check,
            ),
            reductions: with_note(
                if !self.row_teams {
                    let q4 = if self.weight_texels {
                        "16 in a Q4_0 product with int8 activations, its weights read as texels \
                         (option wgpu.weight_texels = false: as words)"
                            .to_string()
                    } else {
                        "eight in a Q4_0 decode product".into()
                    };
                    format!(
                        "none: each lane walks whole rows, four at a time, {q4} (the \
                         software-adapter shape; option wgpu.row_teams = on for teams)"
                    )
                } else if self.subgroups {
                    format!(
                        "subgroupAdd (subgroups of {}-{} lanes)",
                        a.subgroup_min_size, a.subgroup_max_size
                    )
                } else if matches!(self.subgroups_check, Some(Verdict::Demoted(_))) {
                    "workgroup memory".into()
                } else if self.adapter_features.contains(wgpu::Features::SUBGROUP) {
                    "workgroup memory (option wgpu.subgroups = false)".into()
                } else {
                    "workgroup memory (no subgroups on this adapter)".into()
                },
                &self.subgroups_check,
            ),
            prefill: with_note(
                if !self.row_teams {
                    format!("{ROW_DOT} (the software-adapter shape)")
                } else if self.tiled_prefill {
                    "64 × 64 tiles, the weights decoded once per tile (mm_tiled)".into()
                } else if matches!(self.tiled_prefill_check, Some(Verdict::Demoted(_))) {
                    ROW_DOT.into()
                } else {
                    format!("{ROW_DOT} (option wgpu.tiled_prefill = false)")
                },
                &self.tiled_prefill_check,
            ),
            profiler: match &self.profiling {
                Profiling::Off => String::new(),
                Profiling::On => "per-kernel GPU timestamps (option wgpu.profile)".into(),
                Profiling::Unavailable(why) => format!("unavailable: {why}"),
            },
            options: self.options.pairs(),
            variants: [
                ("row_teams", self.row_teams),
                ("subgroups", self.row_teams && self.subgroups),
                ("shader_f16", self.native_f16),
                ("int_dot", self.int_dot),
                ("tiled_prefill", self.row_teams && self.tiled_prefill),
                ("weight_texels", self.weight_texels),
                ("profile", self.profiling == Profiling::On),
            ]
            .into_iter()
            .filter(|&(_, on)| on)
            .map(|(name, _)| name.to_string())
            .collect(),
        }
    }
}

/// What [`WgpuOptions::profile`] (`asked`) gives on an adapter with `features`.
fn profiling(asked: bool, features: wgpu::Features) -> Profiling {
    if !asked {
        Profiling::Off
    } else if cfg!(target_arch = "wasm32") {
        Profiling::Unavailable(
            "not in the browser: reading the timestamps back needs a blocking wait".into(),
        )
    } else if !features.contains(wgpu::Features::TIMESTAMP_QUERY) {
        Profiling::Unavailable("the adapter has no timestamp-query feature".into())
    } else {
        Profiling::On
    }
}

/// A kernel path's description followed by its self-check verdict, where one ran.
fn with_note(path: String, verdict: &Option<Verdict>) -> String {
    match verdict {
        Some(v) => format!("{path}; {}", v.note()),
        None => path,
    }
}

/// The instance as the environment asks (`WGPU_BACKEND`, ...). With the cargo feature
/// `wgpu-noop` and `WGPU_BACKEND=noop`, wgpu's noop device, shaped like a desktop GPU (a
/// discrete device with subgroups of 32 and every feature), so the backend takes its GPU
/// paths and the host's side of them can be timed.
fn instance_descriptor() -> wgpu::InstanceDescriptor {
    #[allow(unused_mut)] // set only with the noop feature
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    #[cfg(feature = "wgpu-noop")]
    if descriptor.backends == wgpu::Backends::NOOP {
        descriptor.backend_options.noop = wgpu::NoopBackendOptions {
            enable: true,
            device_type: Some(wgpu::DeviceType::DiscreteGpu),
            subgroup_min_size: Some(32),
            subgroup_max_size: Some(32),
            ..Default::default()
        };
    }
    descriptor
}

/// Software rasterizers are correct but slow; `Device::auto` ranks them below the cpu backend.
/// wgpu's noop device runs nothing.
fn device_class(info: &wgpu::AdapterInfo) -> DeviceClass {
    if info.backend == wgpu::Backend::Noop {
        return DeviceClass::Noop;
    }
    let name = info.name.to_ascii_lowercase();
    let software_names = [
        "llvmpipe",
        "lavapipe",
        "swiftshader",
        "warp",
        "microsoft basic render",
    ];
    if info.device_type == wgpu::DeviceType::Cpu || software_names.iter().any(|s| name.contains(s))
    {
        DeviceClass::Software
    } else {
        DeviceClass::Gpu
    }
}

/// The vendor's name from its PCI id where known, else the id in hex.
fn vendor_name(id: u32) -> String {
    match id {
        0x10de => "NVIDIA".into(),
        0x1002 => "AMD".into(),
        0x8086 => "Intel".into(),
        0x106b => "Apple".into(),
        0x5143 => "Qualcomm".into(),
        0x10005 => "Mesa".into(),
        other => format!("{other:#x}"),
    }
}

fn api_name(backend: wgpu::Backend) -> &'static str {
    match backend {
        wgpu::Backend::Vulkan => "Vulkan",
        wgpu::Backend::Metal => "Metal",
        wgpu::Backend::Dx12 => "Dx12",
        wgpu::Backend::Gl => "Gl",
        wgpu::Backend::BrowserWebGpu => "BrowserWebGpu",
        wgpu::Backend::Noop => "Noop",
    }
}
