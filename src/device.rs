//! [`Device`]: which backend runs the ops, and where they fall back to.
//!
//! A device is an ordered chain of backends. The first is the *primary*: tensors are created
//! there and ops run there. When the primary lacks an op (or an op is disabled on it), the op
//! runs on the next backend of the chain that has it, its inputs are moved there, and the
//! fallback is logged at debug level and counted in [`Device::fallbacks`]. The `reference`
//! backend always ends the chain, so every op has somewhere to run.
//!
//! [`Device::auto`] builds the chain from a priority list: the `WEBTENSOR_BACKEND` environment
//! variable (a name or a comma-separated list), else `priority = [...]` in a `webtensor.toml`
//! in the working directory, else the default `cuda, wgpu, cpu`. With the default list a
//! software GPU adapter (lavapipe, SwiftShader, WARP) ranks below `cpu`, because it is slower;
//! naming `wgpu` explicitly picks it anyway.
//!
//! Each backend starts with [`BackendOptions`] (set with [`DeviceBuilder::options`] or
//! [`Device::with_options`]): the typed switches of its kernel variants. [`Device::auto`]
//! takes the defaults with the environment's overrides ([`BackendOptions::from_env`]); the
//! other constructors take exactly the options they are given.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::backend::{
    registry, BackendInfo, BackendKind, BackendOptions, BackendRef, CapturedStep, DeviceClass,
    OpKind, OpSpec,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The environment variable that overrides the backend priority list.
pub const BACKEND_ENV: &str = "WEBTENSOR_BACKEND";
/// The configuration file read from the working directory by [`Device::auto`].
pub const CONFIG_FILE: &str = "webtensor.toml";
/// The priority list used when neither the environment nor a config file gives one.
pub const DEFAULT_PRIORITY: [BackendKind; 3] =
    [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu];

/// Where a priority list came from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrioritySource {
    /// The built-in default.
    Default,
    /// The `WEBTENSOR_BACKEND` environment variable.
    Environment,
    /// A `webtensor.toml` file (its path).
    ConfigFile(String),
    /// Given in code.
    Explicit,
}

/// Why one backend was or was not chosen.
#[derive(Clone, Debug, serde::Serialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct Decision {
    /// The backend.
    pub kind: BackendKind,
    /// Whether it is in the chain (first one = primary).
    pub used: bool,
    /// A one-line reason.
    pub reason: String,
}

/// One op that ran on a fallback backend, and how often.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct Fallback {
    /// The op.
    pub op: OpKind,
    /// The primary backend that lacked it.
    pub from: BackendKind,
    /// The backend that ran it.
    pub to: BackendKind,
    /// How many times.
    pub count: u64,
}

/// A handle to a chain of backends. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    chain: Vec<BackendRef>,
    decisions: Vec<Decision>,
    source: PrioritySource,
    disabled: Vec<(BackendKind, OpKind)>,
    fallbacks: Mutex<BTreeMap<(OpKind, BackendKind, BackendKind), u64>>,
    memory_limit: Option<u64>,
    options: BackendOptions,
}

impl Device {
    /// The best available backend by the priority list (see the module docs), with the
    /// default options overridden by the environment ([`BackendOptions::from_env`]).
    pub fn auto() -> Result<Device> {
        let (priority, source) = priority_from_environment()?;
        Device::builder()
            .priority(priority)
            .source(source)
            .options(BackendOptions::from_env()?)
            .build()
    }

    /// [`Device::auto`] for the browser: the wgpu backend's adapter and device can only be
    /// requested asynchronously there, so this starts the backends of the priority list
    /// without blocking, then builds the device the same way. Natively it is `auto`.
    pub async fn auto_async() -> Result<Device> {
        Device::auto_async_with(BackendOptions::from_env()?).await
    }

    /// [`Device::auto_async`] with `options` (the environment is not read for them).
    pub async fn auto_async_with(options: BackendOptions) -> Result<Device> {
        let (priority, source) = priority_from_environment()?;
        registry::start_async_with(&priority, &options).await;
        Device::builder()
            .priority(priority)
            .source(source)
            .options(options)
            .build()
    }

    /// [`Device::new`] for the browser (see [`Device::auto_async`]).
    pub async fn new_async(name: &str) -> Result<Device> {
        Device::with_options_async(name, BackendOptions::default()).await
    }

    /// [`Device::with_options`] for the browser (see [`Device::auto_async`]).
    pub async fn with_options_async(name: &str, options: BackendOptions) -> Result<Device> {
        registry::start_async_with(&[BackendKind::parse(name)?], &options).await;
        Device::with_options(name, options)
    }

    /// The named backend as primary (`"wgpu"`, `"cpu"`, `"cuda"`, `"reference"`), with `cpu`
    /// and then `reference` as fallbacks; an error says why the named one is not available. A
    /// software adapter is accepted when named. The backends run with the default options.
    pub fn new(name: &str) -> Result<Device> {
        Device::with_options(name, BackendOptions::default())
    }

    /// [`Device::new`] with the backends started with `options`.
    pub fn with_options(name: &str, options: BackendOptions) -> Result<Device> {
        let kind = BackendKind::parse(name)?;
        let mut priority = vec![kind];
        if kind != BackendKind::Cpu && kind != BackendKind::Reference {
            priority.push(BackendKind::Cpu);
        }
        Device::builder()
            .priority(priority)
            .strict(true)
            .options(options)
            .build()
    }

    /// The cpu backend; always available.
    pub fn cpu() -> Device {
        Device::new("cpu").expect("the cpu backend always starts")
    }

    /// The reference backend; always available.
    pub fn reference() -> Device {
        Device::new("reference").expect("the reference backend always starts")
    }

    /// A builder for custom priority lists and disabled ops.
    pub fn builder() -> DeviceBuilder {
        DeviceBuilder::default()
    }

    /// The primary backend.
    pub fn primary(&self) -> &BackendRef {
        &self.inner.chain[0]
    }

    /// The primary backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.primary().kind().name()
    }

    /// The backend kinds of the chain, primary first.
    pub fn chain(&self) -> Vec<BackendKind> {
        self.inner.chain.iter().map(|b| b.kind()).collect()
    }

    /// Bytes the primary backend can still allocate, where known: the host's available
    /// memory for backends that keep tensors in host memory (cpu, reference, and software GPU
    /// adapters such as lavapipe), and at most the builder's
    /// [`memory_limit`](DeviceBuilder::memory_limit); `None` for hardware GPUs without a
    /// limit, whose free memory wgpu does not report (their allocation failures surface as
    /// [`Error::DeviceOutOfMemory`] instead).
    pub fn memory_available(&self) -> Option<u64> {
        let measured = match self.info().class {
            DeviceClass::Cpu | DeviceClass::Software => crate::memory::host_available(),
            DeviceClass::Gpu | DeviceClass::Noop => None,
        };
        match (measured, self.inner.memory_limit) {
            (Some(m), Some(l)) => Some(m.min(l)),
            (m, l) => m.or(l),
        }
    }

    /// Identity, features and limits of the primary backend.
    pub fn info(&self) -> BackendInfo {
        self.primary().info()
    }

    /// The options the device's backends were started with.
    pub fn options(&self) -> &BackendOptions {
        &self.inner.options
    }

    /// Why each backend was or was not chosen.
    pub fn decisions(&self) -> &[Decision] {
        &self.inner.decisions
    }

    /// Where the priority list came from.
    pub fn priority_source(&self) -> &PrioritySource {
        &self.inner.source
    }

    /// Ops that ran on a fallback backend so far, with counts.
    pub fn fallbacks(&self) -> Vec<Fallback> {
        let map = self
            .inner
            .fallbacks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(&(op, from, to), &count)| Fallback {
                op,
                from,
                to,
                count,
            })
            .collect()
    }

    /// Runs all recorded work on every backend of the chain and waits for it.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.chain.iter().try_for_each(|b| b.synchronize())
    }

    /// The primary backend's cumulative GPU time per kernel, where it measures it (see
    /// [`crate::backend::Backend::kernel_profile`]): the wgpu backend with the option
    /// `wgpu.profile`. Covers work already submitted: call after a download or
    /// [`Device::synchronize`].
    pub fn kernel_profile(&self) -> Option<crate::backend::KernelProfile> {
        self.primary().kernel_profile()
    }

    /// [`Device::synchronize`] without blocking (the browser's form).
    pub async fn synchronize_async(&self) -> Result<()> {
        for backend in &self.inner.chain {
            backend.synchronize_async().await?;
        }
        Ok(())
    }

    /// Loses the primary backend's device now, as a driver reset would (wgpu's
    /// `Device::destroy`): every later op on it returns [`Error::DeviceLost`]. Only for tests
    /// of that path; the backend is shared by the whole process, so every `Device` using it is
    /// lost too. Host backends have nothing to lose and ignore it.
    #[doc(hidden)]
    pub fn lose_for_testing(&self) {
        self.primary().lose_device();
    }

    /// Whether two handles are the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the primary backend runs the fused op `spec` for inputs of `dtype` itself:
    /// implements it, does not have it disabled, and does not prefer the composition at its
    /// sizes. Ops with a composition into other ops ([`OpKind::FUSED`]) use that composition
    /// when it does not, rather than moving to another backend.
    pub(crate) fn primary_fuses(&self, spec: &OpSpec, dtype: DType) -> bool {
        let primary = self.primary();
        let op = spec.kind();
        primary.supports(op, dtype)
            && !self.inner.disabled.contains(&(primary.kind(), op))
            && !primary.prefers_composition(spec)
    }

    /// The backend that runs `op` for inputs of `dtype`: the first of the chain that
    /// implements it and does not have it disabled. Records a fallback when that is not the
    /// primary.
    /// Runs `step` while the primary backend keeps what it records (see
    /// [`CapturedStep`]): its result, and the recorded work where the backend can replay it.
    /// A step that fails while it is recorded (a backend may refuse work during a capture that
    /// it runs otherwise) is run again unrecorded, so `step` must give the same result when
    /// run twice (a decode step does: its inputs are written before it).
    pub fn capture<T>(&self, step: impl Fn() -> Result<T>) -> Result<(T, Option<CapturedStep>)> {
        let backend = self.primary();
        if !backend.begin_capture() {
            return Ok((step()?, None));
        }
        let result = step();
        let captured = backend.end_capture();
        match result {
            Ok(value) => Ok((value, captured)),
            Err(e) => {
                log::debug!("webtensor: a step failed while recorded ({e}); running it again");
                Ok((step()?, None))
            }
        }
    }

    /// Records `step`, captured on this device's primary backend, again with `keys` keys for
    /// its attention.
    pub fn replay(&self, step: &CapturedStep, keys: usize) -> Result<()> {
        self.primary().replay(step, keys)
    }

    pub(crate) fn backend_for(&self, op: OpKind, dtype: DType) -> &BackendRef {
        let chosen = self
            .inner
            .chain
            .iter()
            .find(|b| b.supports(op, dtype) && !self.inner.disabled.contains(&(b.kind(), op)))
            // The reference ends every chain and implements every op.
            .unwrap_or_else(|| self.inner.chain.last().expect("chain is never empty"));
        let primary = self.primary().kind();
        if chosen.kind() != primary {
            log::debug!(
                "webtensor: {op} ({dtype}) is not available on {primary}; running it on {}",
                chosen.kind()
            );
            let mut map = self
                .inner
                .fallbacks
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *map.entry((op, primary, chosen.kind())).or_default() += 1;
        }
        chosen
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = self.chain().iter().map(|k| k.name()).collect();
        write!(f, "Device({})", names.join(" → "))
    }
}

/// Builds a [`Device`] from a priority list.
#[derive(Default)]
pub struct DeviceBuilder {
    priority: Option<Vec<BackendKind>>,
    source: Option<PrioritySource>,
    disabled: Vec<(BackendKind, OpKind)>,
    strict: bool,
    memory_limit: Option<u64>,
    separate: bool,
    options: BackendOptions,
}

impl DeviceBuilder {
    /// The backends to try, best first. Unavailable ones are skipped.
    pub fn priority(mut self, kinds: Vec<BackendKind>) -> Self {
        self.priority = Some(kinds);
        self
    }

    /// Never run `op` on `backend`; it falls back to the next backend of the chain. Useful to
    /// work around a driver bug, and to test fallback.
    pub fn disable_op(mut self, backend: BackendKind, op: OpKind) -> Self {
        self.disabled.push((backend, op));
        self
    }

    /// Caps the memory webtensor plans to use on the device at `bytes`: model weights and KV
    /// caches that would need more are refused with [`Error::OutOfMemory`] before anything is
    /// allocated (see [`Device::memory_available`]). For a device shared with other work, and
    /// for testing what happens when memory runs short.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Starts a GPU backend of its own for this device rather than sharing the process-wide
    /// one: a separate logical device on the same adapter, with its own queue and memory.
    /// Tensor parallelism (`webtensor_llm::Llama::load_parallel`) uses such devices to split
    /// a model over one adapter (lavapipe gives as many as asked for, so tests run it for
    /// real). Host backends (cpu, reference) have no device to separate and are shared.
    pub fn separate(mut self, separate: bool) -> Self {
        self.separate = separate;
        self
    }

    /// The options the backends start with (default: [`BackendOptions::default`]; the
    /// environment is not read here, see [`BackendOptions::from_env`]). Each backend reads
    /// its own part; backends are shared between devices with the same options.
    pub fn options(mut self, options: BackendOptions) -> Self {
        self.options = options;
        self
    }

    /// Fail unless the first backend of the priority list is available.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    fn source(mut self, source: PrioritySource) -> Self {
        self.source = Some(source);
        self
    }

    /// Starts the backends and builds the chain.
    pub fn build(self) -> Result<Device> {
        let source = self.source.unwrap_or(if self.priority.is_some() {
            PrioritySource::Explicit
        } else {
            PrioritySource::Default
        });
        let priority = self.priority.unwrap_or_else(|| DEFAULT_PRIORITY.to_vec());
        if priority.is_empty() {
            return Err(Error::Config {
                source_name: "priority list".into(),
                reason: "it is empty".into(),
            });
        }
        let demote_software = source == PrioritySource::Default;
        let mut ready = Vec::new();
        let mut demoted = Vec::new();
        let mut decisions = Vec::new();
        let mut failures = Vec::new();
        for (i, &kind) in priority.iter().enumerate() {
            let probe = if self.separate {
                registry::start_separate(kind, &self.options)
            } else {
                registry::get_with(kind, &self.options)
            };
            match probe {
                Ok(backend) => {
                    // Neither a software adapter nor a device that runs nothing is the fastest.
                    let software = matches!(
                        backend.info().class,
                        DeviceClass::Software | DeviceClass::Noop
                    );
                    if software && demote_software {
                        demoted.push(backend);
                    } else {
                        ready.push(backend);
                    }
                }
                Err(reason) => {
                    if i == 0 && self.strict {
                        return Err(Error::BackendUnavailable {
                            backend: kind,
                            reason,
                        });
                    }
                    failures.push(format!("{kind}: {reason}"));
                    decisions.push(Decision {
                        kind,
                        used: false,
                        reason,
                    });
                }
            }
        }
        // Software adapters go after every hardware or CPU backend of the list.
        let demoted_kinds: Vec<_> = demoted.iter().map(|b| b.kind()).collect();
        ready.extend(demoted);
        if ready.is_empty() {
            return Err(Error::NoBackend {
                priority: priority.clone(),
                reasons: failures.join("; "),
            });
        }
        for (pos, b) in ready.iter().enumerate() {
            let info = b.info();
            let mut reason = if pos == 0 {
                format!(
                    "primary: first available in the {} priority list",
                    source_label(&source)
                )
            } else {
                format!("fallback #{pos}")
            };
            if demoted_kinds.contains(&b.kind()) {
                reason.push_str(&format!(
                    " ({} is a software adapter, ranked below the cpu backend; set {BACKEND_ENV}={} to prefer it)",
                    info.device_name,
                    b.kind()
                ));
            }
            decisions.push(Decision {
                kind: b.kind(),
                used: true,
                reason,
            });
        }
        if !ready.iter().any(|b| b.kind() == BackendKind::Reference) {
            let reference = registry::get(BackendKind::Reference).map_err(|reason| {
                Error::BackendUnavailable {
                    backend: BackendKind::Reference,
                    reason,
                }
            })?;
            decisions.push(Decision {
                kind: BackendKind::Reference,
                used: true,
                reason: "last-resort fallback for ops no other backend has".into(),
            });
            ready.push(reference);
        }
        decisions.sort_by_key(|d| !d.used);
        Ok(Device {
            inner: Arc::new(DeviceInner {
                chain: ready,
                decisions,
                source,
                disabled: self.disabled,
                fallbacks: Mutex::new(BTreeMap::new()),
                memory_limit: self.memory_limit,
                options: self.options,
            }),
        })
    }
}

fn source_label(source: &PrioritySource) -> String {
    match source {
        PrioritySource::Default => "default".into(),
        PrioritySource::Environment => BACKEND_ENV.to_string(),
        PrioritySource::ConfigFile(p) => p.clone(),
        PrioritySource::Explicit => "given".into(),
    }
}

/// Reads the priority list: `WEBTENSOR_BACKEND`, then `./webtensor.toml`, then the default.
pub fn priority_from_environment() -> Result<(Vec<BackendKind>, PrioritySource)> {
    if let Ok(value) = std::env::var(BACKEND_ENV) {
        if !value.trim().is_empty() {
            let list = parse_list(value.split(','), BACKEND_ENV)?;
            return Ok((list, PrioritySource::Environment));
        }
    }
    let path = Path::new(CONFIG_FILE);
    if path.exists() {
        let list = read_config(path)?;
        return Ok((list, PrioritySource::ConfigFile(path.display().to_string())));
    }
    Ok((DEFAULT_PRIORITY.to_vec(), PrioritySource::Default))
}

/// Reads `priority = ["wgpu", "cpu"]` from a webtensor.toml file.
pub fn read_config(path: &Path) -> Result<Vec<BackendKind>> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: name.clone(),
        source,
    })?;
    parse_config(&text, &name)
}

/// Parses the text of a webtensor.toml file; `source_name` names it in errors.
pub fn parse_config(text: &str, source_name: &str) -> Result<Vec<BackendKind>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        priority: Vec<String>,
    }
    let config: Config = toml::from_str(text).map_err(|e| Error::Config {
        source_name: source_name.into(),
        reason: e.message().to_string(),
    })?;
    parse_list(config.priority.iter().map(String::as_str), source_name)
}

fn parse_list<'a>(
    names: impl Iterator<Item = &'a str>,
    source_name: &str,
) -> Result<Vec<BackendKind>> {
    let list = names.map(BackendKind::parse).collect::<Result<Vec<_>>>()?;
    if list.is_empty() {
        return Err(Error::Config {
            source_name: source_name.into(),
            reason: "the priority list is empty".into(),
        });
    }
    Ok(list)
}
