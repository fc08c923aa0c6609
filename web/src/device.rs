//! Devices: choosing a backend in the browser and creating tensors on it.

use wasm_bindgen::prelude::*;
use webtensor::backend::{BackendOptions, CpuOptions, CudaOptions, WgpuOptions};
use webtensor::tensor::Element;
use webtensor::{BackendKind, DType};

use crate::error::{js, js_error, to_js_object};
use crate::tensor::Tensor;

/// A device: a chain of backends, the first of which runs the ops (see the library's
/// `Device`).
#[wasm_bindgen]
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: webtensor::Device,
}

/// What `Device.info()` returns.
#[derive(serde::Serialize, tsify::Tsify)]
pub struct DeviceInfo {
    /// The backend that runs the ops: "wgpu", "cpu" or "reference".
    backend: String,
    /// The backend chain, primary first.
    chain: Vec<BackendKind>,
    /// The primary backend's identity, features and limits.
    info: webtensor::BackendInfo,
    /// Why each backend was or was not chosen.
    decisions: Vec<webtensor::device::Decision>,
    /// Ops that ran on a fallback backend so far, and how often.
    fallbacks: Vec<webtensor::device::Fallback>,
}

/// What `createDevice` takes as an object: the backend, and the options of the backends'
/// kernel variants (the library's `BackendOptions`: every field optional, its default what
/// webtensor runs unasked). A key that is not one of these is an error naming it.
#[derive(serde::Deserialize, tsify::Tsify)]
#[serde(deny_unknown_fields)]
pub struct DeviceOptions {
    /// `"auto"` (the default), `"wgpu"`, `"cpu"` or `"reference"`, as `createDevice(name)`.
    #[serde(default)]
    backend: Option<String>,
    /// The wgpu backend's options, e.g. `{ rowTeams: "on", intDot: false }`.
    #[serde(default)]
    wgpu: WgpuOptions,
    /// The cpu backend's options, e.g. `{ simd: "simd128" }`.
    #[serde(default)]
    cpu: CpuOptions,
    /// The cuda backend's options (no cuda backend runs in the browser; accepted and ignored).
    #[serde(default)]
    cuda: CudaOptions,
}

impl DeviceOptions {
    /// The options from `createDevice`'s argument: a backend's name, or a [`DeviceOptions`]
    /// object, or nothing.
    fn from_js(value: &JsValue) -> Result<(Option<String>, BackendOptions), JsValue> {
        if value.is_undefined() || value.is_null() {
            return Ok((None, BackendOptions::default()));
        }
        if let Some(name) = value.as_string() {
            return Ok((Some(name), BackendOptions::default()));
        }
        let text: String = js_sys::JSON::stringify(value)?.into();
        let o: DeviceOptions = serde_json::from_str(&text)
            .map_err(|e| js_error(format!("createDevice: bad options: {e}")))?;
        let options = BackendOptions {
            wgpu: o.wgpu,
            cpu: o.cpu,
            cuda: o.cuda,
        };
        Ok((o.backend, options))
    }
}

/// Creates a device. Without a name (or with `"auto"`) it takes the best available backend
/// by the default priority (a hardware WebGPU adapter, else `cpu`); with `"wgpu"`, `"cpu"` or
/// `"reference"` it takes that one and rejects with the reason when it is not available here
/// (for example when the browser has no WebGPU). Instead of a name it takes an options object,
/// `{ backend: "wgpu", wgpu: { rowTeams: "on" } }` ([`DeviceOptions`]); `info().info.options`
/// then lists the options the primary backend runs with.
#[wasm_bindgen(js_name = createDevice)]
pub async fn create_device(
    #[wasm_bindgen(unchecked_optional_param_type = "string | DeviceOptions | null")]
    options: JsValue,
) -> Result<Device, JsValue> {
    let (name, options) = DeviceOptions::from_js(&options)?;
    let inner = match name.as_deref().map(str::trim) {
        None | Some("") | Some("auto") => webtensor::Device::auto_async_with(options).await,
        Some(name) => webtensor::Device::with_options_async(name, options).await,
    };
    Ok(Device { inner: js(inner)? })
}

/// Why the browser's WebGPU cannot be used, or `undefined` when it can.
#[wasm_bindgen(js_name = webgpuUnavailableReason)]
pub async fn webgpu_unavailable_reason() -> Option<String> {
    webtensor::backend::registry::start_async(&[BackendKind::Wgpu]).await;
    webtensor::backend::registry::get(BackendKind::Wgpu).err()
}

#[wasm_bindgen]
impl Device {
    /// The name of the backend that runs the ops: `"wgpu"`, `"cpu"` or `"reference"`.
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.inner.backend_name().to_string()
    }

    /// The backend chain, primary first (ops the primary lacks run on the next one).
    #[wasm_bindgen(getter)]
    pub fn chain(&self) -> Vec<String> {
        self.inner
            .chain()
            .iter()
            .map(|k| k.name().to_string())
            .collect()
    }

    /// Capabilities: `{ backend, chain, info, decisions, fallbacks }`, where `info` is the
    /// primary backend's identity, features and limits (adapter name, API, `shader-f16`,
    /// largest storage binding, SIMD level) and `decisions` says why each backend was or was
    /// not chosen.
    #[wasm_bindgen(unchecked_return_type = "DeviceInfo")]
    pub fn info(&self) -> Result<JsValue, JsValue> {
        to_js_object(&DeviceInfo {
            backend: self.inner.backend_name().to_string(),
            chain: self.inner.chain(),
            info: self.inner.info(),
            decisions: self.inner.decisions().to_vec(),
            fallbacks: self.inner.fallbacks(),
        })
    }

    /// A tensor from a typed array (`Float32Array` → f32, `Uint32Array` → u32, `Int32Array` →
    /// i32, `Int8Array` → i8) and a shape whose element count matches its length.
    pub fn tensor(&self, data: &JsValue, shape: Vec<usize>) -> Result<Tensor, JsValue> {
        let dev = &self.inner;
        let t = if let Some(a) = data.dyn_ref::<js_sys::Float32Array>() {
            from_vec(dev, a.to_vec(), shape)
        } else if let Some(a) = data.dyn_ref::<js_sys::Uint32Array>() {
            from_vec(dev, a.to_vec(), shape)
        } else if let Some(a) = data.dyn_ref::<js_sys::Int32Array>() {
            from_vec(dev, a.to_vec(), shape)
        } else if let Some(a) = data.dyn_ref::<js_sys::Int8Array>() {
            from_vec(dev, a.to_vec(), shape)
        } else {
            return Err(js_error(
                "tensor: data must be a Float32Array, Uint32Array, Int32Array or Int8Array",
            ));
        };
        Ok(Tensor { inner: js(t)? })
    }

    /// A tensor of packed data (`"f16"`, `"q8_0"`, `"q4_0"`, `"tq1_0"`, `"tq2_0"`,
    /// `"ternary_planes"`, llama.cpp's `"q2_k"` … `"q6_k"`, `"iq4_xs"`, `"q4_1"`, `"q5_0"`,
    /// `"q5_1"`, `"iq4_nl"` and `"bf16"`) from its raw little-endian bytes (GGUF's block
    /// layout); bytes that are not whole rows of the format's blocks are an error.
    #[wasm_bindgen(js_name = tensorFromBytes)]
    pub fn tensor_from_bytes(
        &self,
        dtype: &str,
        bytes: &[u8],
        shape: Vec<usize>,
    ) -> Result<Tensor, JsValue> {
        let dtype =
            DType::parse(dtype).ok_or_else(|| js_error(format!("unknown dtype `{dtype}`")))?;
        let t = webtensor::Tensor::from_bytes(&self.inner, dtype, bytes.to_vec(), shape);
        Ok(Tensor { inner: js(t)? })
    }

    /// Runs all recorded work and resolves when the device has finished it.
    pub async fn synchronize(&self) -> Result<(), JsValue> {
        js(self.inner.synchronize_async().await)
    }
}

fn from_vec<T: Element>(
    dev: &webtensor::Device,
    data: Vec<T>,
    shape: Vec<usize>,
) -> webtensor::Result<webtensor::Tensor> {
    webtensor::Tensor::from_vec(dev, data, shape)
}
