//! How much memory the host can still give this process, so a request that cannot fit (a
//! KV cache for a whole long context, a model larger than memory) is refused with a typed
//! error before it is attempted, instead of aborting the process on a failed allocation.

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
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(soft.saturating_sub(used_kib.saturating_mul(1024)))
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn linux_reports_available_memory() {
        let a = super::host_available().expect("Linux has /proc/meminfo");
        assert!(a > 1 << 20, "{a} bytes available");
    }
}
