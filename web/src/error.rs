//! Library errors as JavaScript `Error`s.

use wasm_bindgen::JsValue;

/// A JavaScript `Error` with `message` (what a rejected promise or a throw carries).
pub(crate) fn js_error(message: impl std::fmt::Display) -> JsValue {
    js_sys::Error::new(&message.to_string()).into()
}

/// Converts a library result for returning to JavaScript.
pub(crate) fn js<T>(r: webtensor::Result<T>) -> Result<T, JsValue> {
    r.map_err(js_error)
}

/// A value serialised to a plain JavaScript object (through JSON, so it is exactly what the
/// native tool's `--json` output holds).
pub(crate) fn to_js_object<T: serde::Serialize>(value: &T) -> Result<JsValue, JsValue> {
    let text = serde_json::to_string(value).map_err(js_error)?;
    js_sys::JSON::parse(&text)
}
