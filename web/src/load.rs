//! Reading model bytes in the browser: a `File` in chunks, or a URL through `fetch` as the
//! body streams in, reporting progress as it goes.

use js_sys::{Function, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{File, ReadableStreamDefaultReader, Response};

use crate::error::js_error;
use crate::generation::check_signal;

/// Bytes read per `File` chunk.
const FILE_CHUNK: f64 = (16 << 20) as f64;

/// Calls the page's progress callback `(phase, done, total)`; a throwing callback is ignored
/// (it must not abort a load).
pub(crate) fn report(progress: Option<&Function>, phase: &str, done: f64, total: f64) {
    if let Some(f) = progress {
        let _ = f.call3(
            &JsValue::NULL,
            &JsValue::from_str(phase),
            &JsValue::from(done),
            &JsValue::from(total),
        );
    }
}

/// The whole contents of `file`, read in chunks; `progress("read", bytes so far, size)`.
/// Aborting `signal` (an `AbortSignal` or `undefined`) rejects with its reason.
pub(crate) async fn read_file(
    file: &File,
    progress: Option<&Function>,
    signal: &JsValue,
) -> Result<Vec<u8>, JsValue> {
    let size = file.size();
    let mut out = Vec::with_capacity(size as usize);
    let mut at = 0.0;
    report(progress, "read", 0.0, size);
    while at < size {
        check_signal(signal)?;
        let end = (at + FILE_CHUNK).min(size);
        let chunk = file.slice_with_f64_and_f64(at, end)?;
        let buffer = JsFuture::from(chunk.array_buffer()).await?;
        out.extend_from_slice(&Uint8Array::new(&buffer).to_vec());
        at = end;
        report(progress, "read", at, size);
    }
    Ok(out)
}

/// The body of `url`, fetched with the page's `fetch`; `progress("download", bytes so far,
/// Content-Length or 0 when unknown)`. A non-2xx answer is an error naming the status;
/// aborting `signal` (an `AbortSignal` or `undefined`) cancels the download.
pub(crate) async fn fetch_bytes(
    url: &str,
    progress: Option<&Function>,
    signal: &JsValue,
) -> Result<Vec<u8>, JsValue> {
    let fetch: Function = Reflect::get(&js_sys::global(), &JsValue::from_str("fetch"))?
        .dyn_into()
        .map_err(|_| js_error("this environment has no fetch()"))?;
    let init = js_sys::Object::new();
    if !signal.is_undefined() && !signal.is_null() {
        Reflect::set(&init, &JsValue::from_str("signal"), signal)?;
    }
    let promise: js_sys::Promise = fetch
        .call2(&JsValue::NULL, &JsValue::from_str(url), &init)?
        .dyn_into()?;
    let response: Response = JsFuture::from(promise).await?.dyn_into()?;
    if !response.ok() {
        return Err(js_error(format!(
            "fetching {url} failed: HTTP {} {}",
            response.status(),
            response.status_text()
        )));
    }
    let total = response
        .headers()
        .get("content-length")?
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let Some(body) = response.body() else {
        return Ok(Vec::new());
    };
    let reader: ReadableStreamDefaultReader = body.get_reader().dyn_into()?;
    let mut out = Vec::with_capacity(total as usize);
    report(progress, "download", 0.0, total);
    loop {
        check_signal(signal)?;
        let chunk = JsFuture::from(reader.read()).await?;
        if Reflect::get(&chunk, &JsValue::from_str("done"))?.is_truthy() {
            break;
        }
        let value: Uint8Array = Reflect::get(&chunk, &JsValue::from_str("value"))?.dyn_into()?;
        out.extend_from_slice(&value.to_vec());
        report(progress, "download", out.len() as f64, total);
    }
    Ok(out)
}
