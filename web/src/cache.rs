//! Models fetched by URL, kept in the browser's Cache Storage (cache `webtensor-models`, one
//! entry per URL) so that a second visit loads them without a download; and the page's view of
//! that cache: `cachedModels()` lists the entries with their sizes, `deleteCachedModel(url)`
//! removes one.
//!
//! Where the page has no Cache Storage (an insecure `http:` origin other than localhost), URLs
//! are fetched every time.

use js_sys::{Array, Function, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, CacheStorage, Request, Response};

use crate::error::{js_error, to_js_object};
use crate::load::read_body;

/// The Cache Storage cache that holds the models.
const CACHE_NAME: &str = "webtensor-models";

/// One model in the cache, as `cachedModels()` lists it.
#[derive(serde::Serialize, tsify::Tsify)]
pub struct CachedModel {
    /// The URL it was fetched from (what `Model.fromUrl` and `deleteCachedModel` take).
    url: String,
    /// Its size in bytes.
    bytes: f64,
}

/// The models cache, or `None` where the page has no Cache Storage.
async fn open() -> Result<Option<Cache>, JsValue> {
    let caches = Reflect::get(&js_sys::global(), &JsValue::from_str("caches"))?;
    let Ok(caches) = caches.dyn_into::<CacheStorage>() else {
        return Ok(None);
    };
    let cache = JsFuture::from(caches.open(CACHE_NAME)).await?;
    Ok(Some(cache.dyn_into()?))
}

/// The bytes at `url`: from the cache when it holds them (progress phase "cache"), else
/// fetched (phase "download") and stored in the cache as they stream in. Aborting `signal`
/// (an `AbortSignal` or `undefined`) cancels the download or the read.
pub(crate) async fn fetch_cached(
    url: &str,
    progress: Option<&Function>,
    signal: &JsValue,
) -> Result<Vec<u8>, JsValue> {
    let cache = open().await?;
    if let Some(cache) = &cache {
        let hit = JsFuture::from(cache.match_with_str(url)).await?;
        if let Ok(response) = hit.dyn_into::<Response>() {
            return read_body(response, url, "cache", progress, signal).await;
        }
    }
    let response = fetch(url, signal).await?;
    let Some(cache) = cache else {
        return read_body(response, url, "download", progress, signal).await;
    };
    // The cache reads its own copy of the stream while this one is read into memory.
    let stored = JsFuture::from(cache.put_with_str(url, &response.clone()?));
    let bytes = read_body(response, url, "download", progress, signal).await?;
    if let Err(e) = stored.await {
        // A full disk or quota loses the cache entry, not the model.
        web_sys::console::warn_2(&JsValue::from_str("webtensor: not cached:"), &e);
    }
    Ok(bytes)
}

/// Whether the cache holds `url`.
pub(crate) async fn contains(url: &str) -> Result<bool, JsValue> {
    match open().await? {
        Some(cache) => Ok(JsFuture::from(cache.match_with_str(url))
            .await?
            .is_instance_of::<Response>()),
        None => Ok(false),
    }
}

/// `fetch(url)`, refused with the HTTP status when it is not 2xx; aborting `signal` (an
/// `AbortSignal` or `undefined`) cancels it.
pub(crate) async fn fetch(url: &str, signal: &JsValue) -> Result<Response, JsValue> {
    let init = js_sys::Object::new();
    if !signal.is_undefined() && !signal.is_null() {
        Reflect::set(&init, &JsValue::from_str("signal"), signal)?;
    }
    fetch_with(url, &init).await
}

/// `fetch(url, init)` with the page's (or worker's) `fetch`, refused with the HTTP status when
/// it is not 2xx: the one place this crate fetches a URL.
pub(crate) async fn fetch_with(url: &str, init: &js_sys::Object) -> Result<Response, JsValue> {
    let fetch: Function = Reflect::get(&js_sys::global(), &JsValue::from_str("fetch"))?
        .dyn_into()
        .map_err(|_| js_error("this environment has no fetch()"))?;
    let promise: js_sys::Promise = fetch
        .call2(&JsValue::NULL, &JsValue::from_str(url), init)?
        .dyn_into()?;
    let response: Response = JsFuture::from(promise).await?.dyn_into()?;
    if !response.ok() {
        return Err(js_error(format!(
            "fetching {url} failed: HTTP {} {}",
            response.status(),
            response.status_text()
        )));
    }
    Ok(response)
}

/// Removes `url` from the cache (after a download that is not a model, say).
pub(crate) async fn forget(url: &str) -> Result<bool, JsValue> {
    match open().await? {
        Some(cache) => Ok(JsFuture::from(cache.delete_with_str(url))
            .await?
            .is_truthy()),
        None => Ok(false),
    }
}

/// The models in the cache, with their sizes in bytes.
#[wasm_bindgen(js_name = cachedModels, unchecked_return_type = "CachedModel[]")]
pub async fn cached_models() -> Result<JsValue, JsValue> {
    let mut out = Vec::new();
    if let Some(cache) = open().await? {
        let requests: Array = JsFuture::from(cache.keys()).await?.dyn_into()?;
        for request in requests.iter() {
            let request: Request = request.dyn_into()?;
            let response: Response = JsFuture::from(cache.match_with_request(&request))
                .await?
                .dyn_into()?;
            out.push(CachedModel {
                url: request.url(),
                bytes: size(&response).await?,
            });
        }
    }
    to_js_object(&out)
}

/// Removes the model fetched from `url` from the cache; resolves with whether it was there.
#[wasm_bindgen(js_name = deleteCachedModel)]
pub async fn delete_cached_model(url: String) -> Result<bool, JsValue> {
    forget(&url).await
}

/// A cached body's size: its `Content-Length` where the server sent one for an unencoded
/// body, else the size of the body itself.
async fn size(response: &Response) -> Result<f64, JsValue> {
    let headers = response.headers();
    let encoded = headers
        .get("content-encoding")?
        .is_some_and(|e| e != "identity");
    let length = headers
        .get("content-length")?
        .and_then(|v| v.parse::<f64>().ok());
    match length {
        Some(n) if !encoded => Ok(n),
        _ => {
            let blob: web_sys::Blob = JsFuture::from(response.blob()?).await?.dyn_into()?;
            Ok(blob.size())
        }
    }
}
