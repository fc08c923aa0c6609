//! Reading model bytes in the browser: a `File` in chunks, or a response body (a download or a
//! cache entry, see `cache`) as it streams in, reporting progress as it goes.

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

/// The body of `response` (from `url`), read as it streams in; `progress(phase, bytes so far,
/// Content-Length or 0 when unknown)`. Aborting `signal` (an `AbortSignal` or `undefined`)
/// stops the reading with its reason.
pub(crate) async fn read_body(
    response: Response,
    url: &str,
    phase: &str,
    progress: Option<&Function>,
    signal: &JsValue,
) -> Result<Vec<u8>, JsValue> {
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
    report(progress, phase, 0.0, total);
    loop {
        check_signal(signal)?;
        let chunk = JsFuture::from(reader.read())
            .await
            .map_err(|e| js_error(format!("reading {url} failed: {}", describe(&e))))?;
        if Reflect::get(&chunk, &JsValue::from_str("done"))?.is_truthy() {
            break;
        }
        let value: Uint8Array = Reflect::get(&chunk, &JsValue::from_str("value"))?.dyn_into()?;
        out.extend_from_slice(&value.to_vec());
        report(progress, phase, out.len() as f64, total);
    }
    Ok(out)
}

/// A thrown JavaScript value's message.
fn describe(e: &JsValue) -> String {
    e.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .unwrap_or_else(|| format!("{e:?}"))
}
