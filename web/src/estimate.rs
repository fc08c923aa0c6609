//! The memory a GGUF model will need, estimated from its header before the download (a
//! `Range` request for the first megabytes), and the refusal of a model this page or device
//! cannot hold: a JavaScript `Error` named `ModelTooLargeError` with the `estimate` attached.
//!
//! Two limits are checked. The device's: every tensor must fit one storage binding of the
//! WebGPU adapter (`max_storage_buffer_binding_size`, `max_buffer_size`), and the weights the
//! memory a device reports (natively limited devices). The page's: the download is held in
//! wasm memory, at most 4 GiB for wasm32, with the weights too on the cpu backend; and the
//! browser's `navigator.deviceMemory` where it tells.

use js_sys::{Object, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::ReadableStreamDefaultReader;
use webtensor_llm::gguf;
use webtensor_llm::weights;

use crate::device::Device;
use crate::error::{js_error, to_js_object};

/// Bytes of a GGUF file read first for its header; more is read while the header is longer.
const FIRST_PREFIX: usize = 1 << 20;
/// The most read for a header (large vocabularies take a few megabytes).
const MAX_PREFIX: usize = 64 << 20;
/// wasm32's address space: the most a page's wasm memory can grow to.
const WASM32_MEMORY: f64 = 4.0 * (1u64 << 30) as f64;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** How `Model.fromUrl` refuses a model the device or the page cannot hold, before its download. */
export interface ModelTooLargeError extends Error {
  name: "ModelTooLargeError";
  estimate: MemoryEstimate;
}
"#;

/// What loading a model will take, from its GGUF header.
#[derive(serde::Serialize, tsify::Tsify)]
#[serde(rename_all = "camelCase")]
pub struct MemoryEstimate {
    /// The file's size: the download, held in the page's memory while the model loads.
    file_bytes: f64,
    /// The weights on the device (on WebGPU the embedding table widened to f32).
    device_bytes: f64,
    /// The page memory the load needs at its peak.
    page_bytes: f64,
    /// The largest tensor on the device.
    largest_tensor: String,
    /// Its bytes there.
    largest_tensor_bytes: f64,
    /// The largest buffer one binding of the device can cover (WebGPU), if limited.
    device_buffer_limit: Option<f64>,
    /// The device memory available, where the device reports it.
    device_memory: Option<f64>,
    /// The page memory left: the rest of wasm32's 4 GiB, or less where the browser's
    /// `navigator.deviceMemory` says the machine has less.
    page_memory: f64,
    /// Whether the model fits.
    fits: bool,
    /// Why it does not fit.
    reason: Option<String>,
}

/// Estimates the memory the GGUF model at `url` needs on `device` from the first megabytes of
/// the file (a `Range` request), without downloading the rest.
#[wasm_bindgen(js_name = estimateModel, unchecked_return_type = "MemoryEstimate")]
pub async fn estimate_model(device: &Device, url: String) -> Result<JsValue, JsValue> {
    let estimate = estimate(device, &url).await?.ok_or_else(|| {
        js_error(format!(
            "{url}: the server tells no file size (no Content-Range or Content-Length), so \
             the model cannot be sized before the download"
        ))
    })?;
    to_js_object(&estimate)
}

/// Rejects with a `ModelTooLargeError` (carrying the estimate) when the model at `url` does
/// not fit `device` or the page. A server that tells no file size leaves the model unsized:
/// then the load goes ahead (the library checks again what it can once the file is here).
pub(crate) async fn check_fits(device: &Device, url: &str) -> Result<(), JsValue> {
    let Some(e) = estimate(device, url).await? else {
        return Ok(());
    };
    let Some(reason) = &e.reason else {
        return Ok(());
    };
    let error = js_sys::Error::new(&format!("{url} is too large to load here: {reason}"));
    error.set_name("ModelTooLargeError");
    Reflect::set(&error, &"estimate".into(), &to_js_object(&e)?)?;
    Err(error.into())
}

/// The estimate, or `None` when the server tells no file size.
async fn estimate(device: &Device, url: &str) -> Result<Option<MemoryEstimate>, JsValue> {
    let mut want = FIRST_PREFIX;
    let gguf = loop {
        let Some((prefix, file_len)) = fetch_prefix(url, want).await? else {
            return Ok(None);
        };
        if prefix.get(..4) != Some(b"GGUF".as_slice()) {
            return Err(js_error(format!("{url}: not a GGUF file (no GGUF magic)")));
        }
        let Ok(file_len) = usize::try_from(file_len) else {
            return Ok(Some(beyond_address_space(file_len)));
        };
        match gguf::parse_header(url, &prefix, file_len) {
            Ok(g) => break (g, file_len),
            Err(_) if prefix.len() >= want && want < MAX_PREFIX => want *= 4,
            Err(e) => return Err(js_error(e)),
        }
    };
    let (gguf, file_len) = gguf;
    let inner = &device.inner;
    let keep = weights::keeps_packed(inner);
    let mut largest = (String::new(), 0u64);
    let mut layers_bytes = 0u64;
    for (name, t) in &gguf.tensors {
        let bytes = weights::loaded_bytes(name, t, keep);
        if weights::is_layer_tensor(name) {
            layers_bytes = layers_bytes.saturating_add(bytes);
        }
        if bytes > largest.1 {
            largest = (name.clone(), bytes);
        }
    }
    let outside =
        weights::outside_layers_bytes(gguf.tensors.iter().map(|(n, t)| (n.as_str(), t)), keep);
    let device_bytes = layers_bytes.saturating_add(outside);
    let limit = |name: &str| {
        let limits = inner.info().limits;
        limits.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    };
    let device_buffer_limit = match (
        limit("max_storage_buffer_binding_size"),
        limit("max_buffer_size"),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let device_memory = inner.memory_available();
    // The download stays in wasm memory while the weights are made: on the cpu backend
    // they are a second copy there, on a GPU one tensor at a time passes through.
    let page_bytes = file_len as u64 + if keep { device_bytes } else { largest.1 };
    let page_memory = page_memory_left();
    let reason = if let Some(l) = device_buffer_limit.filter(|&l| largest.1 > l) {
        Some(format!(
            "tensor `{}` needs a buffer of {} but the {} device's largest is {}: use a more \
             quantized model, or the cpu backend",
            largest.0,
            mb(largest.1 as f64),
            inner.backend_name(),
            mb(l as f64)
        ))
    } else if let Some(m) = device_memory.filter(|&m| device_bytes > m) {
        Some(format!(
            "its weights need {} on the {} device, which has {} available",
            mb(device_bytes as f64),
            inner.backend_name(),
            mb(m as f64)
        ))
    } else if page_bytes as f64 > page_memory {
        Some(format!(
            "loading it needs {} of page memory and {} is left (wasm32 pages hold at most \
             4 GiB): use a smaller or more quantized model",
            mb(page_bytes as f64),
            mb(page_memory)
        ))
    } else {
        None
    };
    Ok(Some(MemoryEstimate {
        file_bytes: file_len as f64,
        device_bytes: device_bytes as f64,
        page_bytes: page_bytes as f64,
        largest_tensor: largest.0,
        largest_tensor_bytes: largest.1 as f64,
        device_buffer_limit: device_buffer_limit.map(|l| l as f64),
        device_memory: device_memory.map(|m| m as f64),
        page_memory,
        fits: reason.is_none(),
        reason,
    }))
}

/// The estimate of a file larger than wasm32 can address at all.
fn beyond_address_space(file_len: u64) -> MemoryEstimate {
    let page_memory = page_memory_left();
    MemoryEstimate {
        file_bytes: file_len as f64,
        device_bytes: 0.0,
        page_bytes: file_len as f64,
        largest_tensor: String::new(),
        largest_tensor_bytes: 0.0,
        device_buffer_limit: None,
        device_memory: None,
        page_memory,
        fits: false,
        reason: Some(format!(
            "the file alone is {} and page memory holds at most {} (wasm32): use a smaller or \
             more quantized model",
            mb(file_len as f64),
            mb(page_memory)
        )),
    }
}

fn mb(bytes: f64) -> String {
    format!("{:.0} MB", bytes / 1e6)
}

/// What is left of wasm32's 4 GiB, or of `navigator.deviceMemory` (GiB) where it is less.
fn page_memory_left() -> f64 {
    let used = wasm_bindgen::memory()
        .dyn_into::<js_sys::WebAssembly::Memory>()
        .map(|m| {
            m.buffer()
                .dyn_into::<js_sys::ArrayBuffer>()
                .map_or(0.0, |b| b.byte_length() as f64)
        })
        .unwrap_or(0.0);
    let left = WASM32_MEMORY - used;
    let machine = Reflect::get(&js_sys::global(), &"navigator".into())
        .and_then(|n| Reflect::get(&n, &"deviceMemory".into()))
        .ok()
        .and_then(|m| m.as_f64())
        .map(|gib| gib * (1u64 << 30) as f64);
    machine.map_or(left, |m| m.min(left))
}

/// The first `want` bytes of `url` (fewer when the file is shorter) and the file's length,
/// by a `Range` request; a server that ignores the range sends the whole file, of which only
/// the first bytes are read. `None` when the server tells no length.
async fn fetch_prefix(url: &str, want: usize) -> Result<Option<(Vec<u8>, u64)>, JsValue> {
    let headers = Object::new();
    Reflect::set(
        &headers,
        &"Range".into(),
        &format!("bytes=0-{}", want - 1).into(),
    )?;
    let init = Object::new();
    Reflect::set(&init, &"headers".into(), &headers)?;
    let response = crate::cache::fetch_with(url, &init).await?;
    let header = |name: &str| response.headers().get(name).ok().flatten();
    // "bytes 0-1048575/123456789" on a 206; the Content-Length of the whole file on a 200.
    let file_len = if response.status() == 206 {
        header("content-range").and_then(|r| r.rsplit('/').next()?.parse::<u64>().ok())
    } else {
        header("content-length").and_then(|l| l.parse::<u64>().ok())
    };
    let Some(file_len) = file_len else {
        return Ok(None);
    };
    let mut out = Vec::new();
    if let Some(body) = response.body() {
        let reader: ReadableStreamDefaultReader = body.get_reader().dyn_into()?;
        while out.len() < want {
            let chunk = JsFuture::from(reader.read()).await?;
            if Reflect::get(&chunk, &"done".into())?.is_truthy() {
                break;
            }
            let value: Uint8Array = Reflect::get(&chunk, &"value".into())?.dyn_into()?;
            out.extend_from_slice(&value.to_vec());
        }
        // The rest is not needed (a server that ignored the range is sending everything).
        let _ = reader.cancel();
    }
    out.truncate(want);
    Ok(Some((out, file_len)))
}
