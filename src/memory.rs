//! How much memory the host can still give this process, so a request that cannot fit (a
//! KV cache for a whole long context, a model larger than memory) is refused with a typed
//! error before it is attempted, instead of aborting the process on a failed allocation;
//! and the process's peak resident memory, which `bench --model` reports.

/// Bytes the process can still allocate, where the system says: the smaller of the memory
/// the kernel reports available (`MemAvailable`) and what is left under the process's
/// address-space limit (`ulimit -v`). `None` where neither is known (not Linux, no /proc).
pub(crate) fn host_available() -> Option<u64> {
    let available = meminfo_available();
    let limit = address_space_left();
    match (available, limit) {
        (Some(a), Some(l)) => Some(a.min(l)),
        (a, l) => a.or(l),
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The address-space limit (/proc/self/limits, "Max address space") less the process's
/// current virtual size (/proc/self/status, `VmSize`), in bytes; `None` when unlimited.
fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let used = status_bytes("VmSize:")?;
    Some(soft.saturating_sub(used))
}

/// The most memory the process has held resident so far (`VmHWM` of /proc/self/status: the
/// mapped file pages it touched included), in bytes; `None` where the system does not say
/// (not Linux). For `bench --model`, which the browser build does not have.
#[cfg(not(target_arch = "wasm32"))]
pub fn peak_resident() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Starts [`peak_resident`] again from what is resident now (Linux's `clear_refs` with 5),
/// so that the peak of one piece of work is measured on its own; whether it could.
#[cfg(not(target_arch = "wasm32"))]
pub fn reset_peak_resident() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A `kB` field of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn linux_reports_available_memory() {
        let a = super::host_available().expect("Linux has /proc/meminfo");
        assert!(a > 1 << 20, "{a} bytes available");
    }

    /// The peak covers what was touched, and a reset starts it from what is resident now
    /// (other tests of the process allocate meanwhile: hence the wide margins).
    #[test]
    #[cfg(target_os = "linux")]
    fn the_peak_covers_what_was_touched_and_resets() {
        let mb: u64 = 1 << 20;
        let big = std::hint::black_box(vec![1u8; 256 << 20]);
        let during = super::peak_resident().expect("Linux has VmHWM");
        assert!(during >= 256 * mb, "{during}");
        drop(big);
        if super::reset_peak_resident() {
            let peak = super::peak_resident().unwrap();
            let now = super::status_bytes("VmRSS:").unwrap();
            assert!(
                peak < now + 128 * mb,
                "after a reset: peak {peak}, resident {now}"
            );
        }
    }
}
