//! The harness's clock and its pauses. Natively the clock is `std::time::Instant`; in the
//! browser, where `Instant` is unavailable, it is `performance.now()`, and a pause lets the
//! page's event loop run (repaint, input) between benchmark steps.

/// Seconds since an arbitrary fixed moment (for differences only).
#[cfg(not(target_arch = "wasm32"))]
pub fn now_secs() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// Seconds since an arbitrary fixed moment (for differences only): `performance.now()`,
/// or `Date.now()` where a page has no `performance`.
#[cfg(target_arch = "wasm32")]
pub fn now_secs() -> f64 {
    use js_sys::{Function, Reflect};
    use wasm_bindgen::{JsCast, JsValue};
    let performance_now = || -> Option<f64> {
        let perf = Reflect::get(&js_sys::global(), &JsValue::from_str("performance")).ok()?;
        let now: Function = Reflect::get(&perf, &JsValue::from_str("now"))
            .ok()?
            .dyn_into()
            .ok()?;
        now.call0(&perf).ok()?.as_f64()
    };
    performance_now().unwrap_or_else(js_sys::Date::now) / 1e3
}

/// Seconds of CPU time the calling thread has run (for differences only): what recording and
/// submitting GPU work costs the host, whatever the device does meanwhile. `None` where the
/// platform does not tell (the browser, non-Unix systems).
#[cfg(all(unix, not(target_arch = "wasm32")))]
pub fn thread_cpu_secs() -> Option<f64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (rc == 0).then_some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

/// Seconds of CPU time the calling thread has run: not known on this platform.
#[cfg(not(all(unix, not(target_arch = "wasm32"))))]
pub fn thread_cpu_secs() -> Option<f64> {
    None
}

/// Natively nothing: the harness runs on its own thread.
#[cfg(not(target_arch = "wasm32"))]
pub async fn pause() {}

/// Yields to the browser's event loop through a zero-delay `setTimeout`, so a page stays
/// responsive while a long benchmark runs on its only thread.
#[cfg(target_arch = "wasm32")]
pub async fn pause() {
    use js_sys::{Function, Promise, Reflect};
    use wasm_bindgen::{JsCast, JsValue};
    let promise = Promise::new(&mut |resolve, _reject| {
        let set_timeout = Reflect::get(&js_sys::global(), &JsValue::from_str("setTimeout"))
            .ok()
            .and_then(|f| f.dyn_into::<Function>().ok());
        match set_timeout {
            Some(f) => {
                let _ = f.call2(&JsValue::UNDEFINED, &resolve, &JsValue::from(0));
            }
            None => {
                let _ = resolve.call0(&JsValue::UNDEFINED);
            }
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}
