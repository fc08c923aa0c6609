//! [`BackendOptions`]: the typed switches of the backends' kernel variants, set on a
//! [`crate::DeviceBuilder`] and handed to each backend when it starts.
//!
//! Every field has a default that is what webtensor runs without being asked: the options
//! exist to compare kernel variants on one machine, to work around a driver bug, and to let
//! the tests cover every variant in one process. A backend reads only its own part
//! (`wgpu`, `cpu`, `cuda`); the others ignore it, and the `reference` backend has none.
//!
//! Backends are started once per distinct set of their options and shared by every device
//! asking for the same set (`backend::registry`), so the defaults cost nothing extra and a
//! device with, say, `wgpu.row_teams = On` gets a wgpu device of its own.
//!
//! The environment can override the defaults, in one place: [`BackendOptions::from_env`]
//! (which `Device::auto` and the `webtensor` command line use) reads the `WEBTENSOR_WGPU_*`,
//! `WEBTENSOR_CPU_SIMD` and `WEBTENSOR_CUDA_GRAPHS` variables and refuses a value it does not
//! understand with an error naming the variable and the accepted values. From JavaScript the
//! same fields are set, camelCase as JSON has them, with
//! `createDevice({ backend: "wgpu", wgpu: { rowTeams: "on", intDot: false } })`; an unknown
//! key is an error naming it.

use serde::{Deserialize, Serialize};

use super::cpu::SimdLevel;
use crate::error::{Error, Result};

/// A three-way switch: the backend's own choice for the device, or forced either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum Switch {
    /// The backend decides from what the device is.
    #[default]
    Auto,
    /// Forced on.
    On,
    /// Forced off.
    Off,
}

/// What the wgpu backend's runtime self-check (`backend::webgpu::selfcheck`) does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub enum SelfCheck {
    /// Check each variant an adapter feature selects against the reference once per adapter,
    /// driver and build (the verdict is cached on disk), demoting one that disagrees.
    #[default]
    On,
    /// Trust the adapter: no check and no cache.
    Off,
    /// Make every checked variant disagree, so every one is demoted: how the tests see a
    /// demotion on an adapter whose kernels are right.
    Fail,
}

/// The wgpu backend's options. Each `bool` capability switch means "use it where the adapter
/// offers it" when `true` (the default) and "use the portable kernel" when `false`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct WgpuOptions {
    /// Time every dispatch with GPU timestamp queries and total the times per kernel
    /// (`bench --model` prints them; `Device::kernel_profile`). Needs the adapter's
    /// `timestamp-query` feature and a native build (the timestamps are read back with a
    /// blocking wait after each submit, which a browser cannot do); slows submits down.
    /// Default off. Variable: `WEBTENSOR_WGPU_PROFILE=1`.
    pub profile: bool,
    /// Reduce the row teams with `subgroupAdd` where the adapter has subgroups; `false`
    /// reduces through workgroup memory (to cover both on one machine, or to avoid a driver's
    /// broken subgroups). Variable: `WEBTENSOR_WGPU_SUBGROUPS=off`.
    pub subgroups: bool,
    /// Take the int8-activation products' 4-byte dot products with WGSL's `dot4I8Packed`
    /// where the platform has it; `false` writes them out (`shaders/dot4/portable.wgsl`), as
    /// on platforms without it. Variable: `WEBTENSOR_WGPU_INT_DOT=off`.
    pub int_dot: bool,
    /// Run prefill products with packed weights through the 64 × 64 tiles of `mm_tiled` on
    /// the row-team shape; `false` uses the row-dot kernel `mv` (four activation rows per
    /// pass over the weights): to compare the two, or to avoid a driver that miscompiles one.
    /// Ignored on the lanes shape, which has no tiles. Variable:
    /// `WEBTENSOR_WGPU_TILED_PREFILL=off`.
    pub tiled_prefill: bool,
    /// On the lanes shape (CPU adapters), give uploaded Q4_0 tensors a texel copy that the
    /// decode products read about 30% faster; `false` keeps them in storage buffers only
    /// (half the memory of Q4_0 weights, and the storage-word kernel `mv_pairs_lanes`).
    /// Ignored on the row-team shape. Variable: `WEBTENSOR_WGPU_WEIGHT_TEXELS=off`.
    pub weight_texels: bool,
    /// Whether the row-dot kernels split each row across a team of lanes (`On`, the GPU
    /// shape) or give each lane whole rows (`Off`, the shape for adapters that run shaders on
    /// CPU cores); `Auto` takes teams on GPUs and lanes on software adapters. Forcing it
    /// covers the other shape's kernels on one machine. Variable:
    /// `WEBTENSOR_WGPU_ROW_TEAMS=on|off|auto`.
    pub row_teams: Switch,
    /// Use f16 storage through the `shader-f16` WGSL extension where the adapter has it;
    /// `false` reads f16 data as `u32` words with `unpack2x16float`, the path for adapters
    /// without it. Variable: `WEBTENSOR_WGPU_F16=off`.
    pub shader_f16: bool,
    /// The largest storage binding in bytes, when smaller than the adapter's own (at least
    /// 4096): larger tensors are then split into row ranges, which is how the tests reach
    /// that path on lavapipe and how a native run matches a browser's 128 MiB. `None`: the
    /// adapter's limit. Variable: `WEBTENSOR_WGPU_MAX_BINDING=<bytes>`.
    pub max_binding: Option<u64>,
    /// The runtime self-check of the variants an adapter feature selects (see [`SelfCheck`]).
    /// Variable: `WEBTENSOR_WGPU_SELFCHECK=on|off|fail`.
    pub self_check: SelfCheck,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            profile: false,
            subgroups: true,
            int_dot: true,
            tiled_prefill: true,
            weight_texels: true,
            row_teams: Switch::Auto,
            shader_f16: true,
            max_binding: None,
            self_check: SelfCheck::On,
        }
    }
}

/// The cpu backend's options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct CpuOptions {
    /// The SIMD instruction set of the kernels; `None` (the default) detects the best this CPU
    /// has. A level the CPU lacks falls back to the best one it has, with a warning, and
    /// `info` shows the level in effect. Forcing one covers every path on one machine.
    /// Variable: `WEBTENSOR_CPU_SIMD=scalar|avx2|avx512|neon|simd128|auto`.
    pub simd: Option<SimdLevel>,
}

/// The cuda backend's options.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct CudaOptions {
    /// Replay recorded decode steps as CUDA graphs (one launch per token); `false` runs every
    /// step as ops, to compare the two or to avoid a driver's graph bug. Default on.
    /// Variable: `WEBTENSOR_CUDA_GRAPHS=off`.
    pub graphs: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { graphs: true }
    }
}

/// The options of every backend, each reading its own part (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct BackendOptions {
    /// The wgpu backend's.
    pub wgpu: WgpuOptions,
    /// The cpu backend's.
    pub cpu: CpuOptions,
    /// The cuda backend's (ignored without the `cuda` cargo feature).
    pub cuda: CudaOptions,
}

/// `WEBTENSOR_WGPU_PROFILE`: [`WgpuOptions::profile`].
pub const PROFILE_ENV: &str = "WEBTENSOR_WGPU_PROFILE";
/// `WEBTENSOR_WGPU_SUBGROUPS`: [`WgpuOptions::subgroups`].
pub const SUBGROUPS_ENV: &str = "WEBTENSOR_WGPU_SUBGROUPS";
/// `WEBTENSOR_WGPU_INT_DOT`: [`WgpuOptions::int_dot`].
pub const INT_DOT_ENV: &str = "WEBTENSOR_WGPU_INT_DOT";
/// `WEBTENSOR_WGPU_TILED_PREFILL`: [`WgpuOptions::tiled_prefill`].
pub const TILED_PREFILL_ENV: &str = "WEBTENSOR_WGPU_TILED_PREFILL";
/// `WEBTENSOR_WGPU_WEIGHT_TEXELS`: [`WgpuOptions::weight_texels`].
pub const WEIGHT_TEXELS_ENV: &str = "WEBTENSOR_WGPU_WEIGHT_TEXELS";
/// `WEBTENSOR_WGPU_ROW_TEAMS`: [`WgpuOptions::row_teams`].
pub const ROW_TEAMS_ENV: &str = "WEBTENSOR_WGPU_ROW_TEAMS";
/// `WEBTENSOR_WGPU_F16`: [`WgpuOptions::shader_f16`].
pub const F16_ENV: &str = "WEBTENSOR_WGPU_F16";
/// `WEBTENSOR_WGPU_MAX_BINDING`: [`WgpuOptions::max_binding`].
pub const MAX_BINDING_ENV: &str = "WEBTENSOR_WGPU_MAX_BINDING";
/// `WEBTENSOR_WGPU_SELFCHECK`: [`WgpuOptions::self_check`].
pub const SELFCHECK_ENV: &str = "WEBTENSOR_WGPU_SELFCHECK";
/// `WEBTENSOR_CPU_SIMD`: [`CpuOptions::simd`].
pub const SIMD_ENV: &str = "WEBTENSOR_CPU_SIMD";
/// `WEBTENSOR_CUDA_GRAPHS`: [`CudaOptions::graphs`].
pub const CUDA_GRAPHS_ENV: &str = "WEBTENSOR_CUDA_GRAPHS";

/// The smallest [`WgpuOptions::max_binding`].
pub const MIN_MAX_BINDING: u64 = 4096;

impl BackendOptions {
    /// The defaults with the environment's overrides applied (the variables are named on
    /// each field). An unset or empty variable leaves its field alone; a value that is not
    /// one the field takes is an [`Error::Config`] naming the variable and the accepted
    /// values. In the browser there is no environment, so this is the defaults.
    pub fn from_env() -> Result<BackendOptions> {
        BackendOptions::default().with_vars(|name| std::env::var(name).ok())
    }

    /// `self` with the overrides `var` gives for the variables of [`BackendOptions::from_env`]
    /// (`var(name)` is the variable's value, or `None` when unset).
    pub fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Result<BackendOptions> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let w = &mut self.wgpu;
        for (name, field) in [
            (PROFILE_ENV, &mut w.profile),
            (SUBGROUPS_ENV, &mut w.subgroups),
            (INT_DOT_ENV, &mut w.int_dot),
            (TILED_PREFILL_ENV, &mut w.tiled_prefill),
            (WEIGHT_TEXELS_ENV, &mut w.weight_texels),
            (F16_ENV, &mut w.shader_f16),
        ] {
            if let Some(v) = get(name) {
                *field = parse_bool(name, &v)?;
            }
        }
        if let Some(v) = get(ROW_TEAMS_ENV) {
            w.row_teams = match on_off(&v) {
                Some(true) => Switch::On,
                Some(false) => Switch::Off,
                None if v.trim().eq_ignore_ascii_case("auto") => Switch::Auto,
                None => return Err(bad(ROW_TEAMS_ENV, &v, "on, off, auto")),
            };
        }
        if let Some(v) = get(MAX_BINDING_ENV) {
            let bytes = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&b| b >= MIN_MAX_BINDING)
                .ok_or_else(|| {
                    bad(
                        MAX_BINDING_ENV,
                        &v,
                        &format!("a number of bytes ≥ {MIN_MAX_BINDING}"),
                    )
                })?;
            w.max_binding = Some(bytes);
        }
        if let Some(v) = get(SELFCHECK_ENV) {
            w.self_check = match on_off(&v) {
                Some(true) => SelfCheck::On,
                Some(false) => SelfCheck::Off,
                None if v.trim().eq_ignore_ascii_case("fail") => SelfCheck::Fail,
                None => return Err(bad(SELFCHECK_ENV, &v, "on, off, fail")),
            };
        }
        if let Some(v) = get(SIMD_ENV) {
            self.cpu.simd = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => None,
                name => Some(SimdLevel::parse(name).ok_or_else(|| {
                    bad(SIMD_ENV, &v, "scalar, avx2, avx512, neon, simd128, auto")
                })?),
            };
        }
        if let Some(v) = get(CUDA_GRAPHS_ENV) {
            self.cuda.graphs = parse_bool(CUDA_GRAPHS_ENV, &v)?;
        }
        Ok(self)
    }

    /// The options as `name = value` pairs (`wgpu.row_teams = auto`, ...), for `info` and
    /// the bench report's text.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut out = self.wgpu.pairs();
        out.extend(self.cpu.pairs());
        out.extend(self.cuda.pairs());
        out
    }
}

impl WgpuOptions {
    /// The options as (`wgpu.name`, value) pairs.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let on = |b: bool| if b { "on" } else { "off" }.to_string();
        let switch = |s: Switch| format!("{s:?}").to_ascii_lowercase();
        [
            ("profile", on(self.profile)),
            ("subgroups", on(self.subgroups)),
            ("int_dot", on(self.int_dot)),
            ("tiled_prefill", on(self.tiled_prefill)),
            ("weight_texels", on(self.weight_texels)),
            ("row_teams", switch(self.row_teams)),
            ("shader_f16", on(self.shader_f16)),
            (
                "max_binding",
                self.max_binding
                    .map_or("adapter".to_string(), |b| b.to_string()),
            ),
            (
                "self_check",
                format!("{:?}", self.self_check).to_ascii_lowercase(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (format!("wgpu.{k}"), v))
        .collect()
    }
}

impl CpuOptions {
    /// The options as (`cpu.name`, value) pairs.
    pub fn pairs(&self) -> Vec<(String, String)> {
        vec![(
            "cpu.simd".into(),
            self.simd.map_or("auto".into(), |l| l.name().to_string()),
        )]
    }
}

impl CudaOptions {
    /// The options as (`cuda.name`, value) pairs.
    pub fn pairs(&self) -> Vec<(String, String)> {
        vec![(
            "cuda.graphs".into(),
            if self.graphs { "on" } else { "off" }.into(),
        )]
    }
}

/// `on`, `1`, `true` and `off`, `0`, `false` (any case), the words every switch takes.
fn on_off(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => Some(true),
        "off" | "0" | "false" => Some(false),
        _ => None,
    }
}

fn parse_bool(name: &str, value: &str) -> Result<bool> {
    on_off(value).ok_or_else(|| bad(name, value, "on, off (or 1, 0, true, false)"))
}

fn bad(name: &str, value: &str, accepted: &str) -> Error {
    Error::Config {
        source_name: name.to_string(),
        reason: format!("`{value}` is not one of the accepted values: {accepted}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<BackendOptions> {
        BackendOptions::default().with_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn variables_override_the_defaults() {
        assert_eq!(from(&[]).unwrap(), BackendOptions::default());
        let o = from(&[
            (ROW_TEAMS_ENV, "ON"),
            (F16_ENV, "off"),
            (PROFILE_ENV, "1"),
            (MAX_BINDING_ENV, "32768"),
            (SELFCHECK_ENV, "fail"),
            (SIMD_ENV, "scalar"),
            (CUDA_GRAPHS_ENV, "false"),
            (INT_DOT_ENV, ""),
        ])
        .unwrap();
        assert_eq!(o.wgpu.row_teams, Switch::On);
        assert!(!o.wgpu.shader_f16 && o.wgpu.profile && o.wgpu.int_dot);
        assert_eq!(o.wgpu.max_binding, Some(32768));
        assert_eq!(o.wgpu.self_check, SelfCheck::Fail);
        assert_eq!(o.cpu.simd, Some(SimdLevel::Scalar));
        assert!(!o.cuda.graphs);
        assert_eq!(from(&[(SIMD_ENV, "auto")]).unwrap().cpu.simd, None);
    }

    #[test]
    fn a_bad_value_names_the_variable_and_the_accepted_ones() {
        for (name, value, accepted) in [
            (ROW_TEAMS_ENV, "maybe", "on, off, auto"),
            (SUBGROUPS_ENV, "no", "on, off"),
            (MAX_BINDING_ENV, "12", "4096"),
            (SIMD_ENV, "sse9", "avx512"),
            (SELFCHECK_ENV, "x", "fail"),
        ] {
            let e = from(&[(name, value)]).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(value), "{e}");
            assert!(e.contains(accepted), "{e}");
        }
    }

    #[test]
    fn json_fields_are_checked() {
        let o: BackendOptions =
            serde_json::from_str(r#"{"wgpu": {"rowTeams": "on", "intDot": false}}"#).unwrap();
        assert_eq!(o.wgpu.row_teams, Switch::On);
        assert!(!o.wgpu.int_dot && o.wgpu.subgroups);
        let e = serde_json::from_str::<BackendOptions>(r#"{"wgpu": {"rowTeam": "on"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rowTeam"), "{e}");
        let e = serde_json::from_str::<BackendOptions>(r#"{"cpu": {"simd": "sse9"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sse9"), "{e}");
        let o: BackendOptions = serde_json::from_str(r#"{"cpu": {"simd": "avx2"}}"#).unwrap();
        assert_eq!(o.cpu.simd, Some(SimdLevel::Avx2));
    }
}
