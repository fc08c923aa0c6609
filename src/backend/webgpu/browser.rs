//! The browser's own description of its WebGPU adapter (`GPUAdapterInfo`: vendor,
//! architecture, device, description). wgpu passes on only `description`, which browsers
//! leave empty, so without this the adapter had no name in the page, the bench report or the
//! fallback reason ("( is a software adapter").

use js_sys::{Function, Object, Promise, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// `info` with its empty name (and unknown PCI vendor) filled from the browser's
/// `GPUAdapterInfo` of the adapter the same `power_preference` selects; unchanged where the
/// browser tells nothing more.
pub(crate) async fn name_adapter(
    mut info: wgpu::AdapterInfo,
    power_preference: wgpu::PowerPreference,
) -> wgpu::AdapterInfo {
    let Some(gpu) = adapter_info(power_preference).await else {
        return info;
    };
    if info.name.is_empty() {
        info.name = adapter_name(&gpu);
    }
    if info.vendor == 0 {
        info.vendor = pci_vendor(&gpu.vendor);
    }
    info
}

/// The strings of a `GPUAdapterInfo`; each may be empty (browsers withhold what could
/// fingerprint the machine).
struct GpuAdapterInfo {
    vendor: String,
    architecture: String,
    device: String,
    description: String,
}

/// The adapter's name: the browser's description, else its vendor, architecture and device
/// (e.g. "google swiftshader" for Chromium's software adapter).
fn adapter_name(gpu: &GpuAdapterInfo) -> String {
    if !gpu.description.is_empty() {
        return gpu.description.clone();
    }
    [&gpu.vendor, &gpu.architecture, &gpu.device]
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The PCI vendor id of a `GPUAdapterInfo.vendor` name, or 0 where it has none.
fn pci_vendor(vendor: &str) -> u32 {
    match vendor.to_ascii_lowercase().as_str() {
        "nvidia" => 0x10de,
        "amd" | "ati" => 0x1002,
        "intel" => 0x8086,
        "apple" => 0x106b,
        "qualcomm" => 0x5143,
        _ => 0,
    }
}

/// `(await navigator.gpu.requestAdapter({powerPreference})).info`, or `None` when there is no
/// such adapter or the browser has no `GPUAdapter.info`.
async fn adapter_info(power_preference: wgpu::PowerPreference) -> Option<GpuAdapterInfo> {
    let get = |o: &JsValue, key: &str| Reflect::get(o, &JsValue::from_str(key)).ok();
    let navigator = get(&js_sys::global(), "navigator")?;
    let gpu = get(&navigator, "gpu").filter(|g| !g.is_undefined() && !g.is_null())?;
    let request: Function = get(&gpu, "requestAdapter")?.dyn_into().ok()?;
    let options = Object::new();
    let preference = match power_preference {
        wgpu::PowerPreference::LowPower => "low-power",
        _ => "high-performance",
    };
    Reflect::set(&options, &"powerPreference".into(), &preference.into()).ok()?;
    let promise: Promise = request.call1(&gpu, &options).ok()?.dyn_into().ok()?;
    let adapter = JsFuture::from(promise).await.ok()?;
    let info = get(&adapter, "info").filter(|i| i.is_object())?;
    let text = |key: &str| {
        get(&info, key)
            .and_then(|v| v.as_string())
            .unwrap_or_default()
    };
    Some(GpuAdapterInfo {
        vendor: text("vendor"),
        architecture: text("architecture"),
        device: text("device"),
        description: text("description"),
    })
}
