//! The driver itself running out of memory: buffers the driver cannot back become
//! `Error::DeviceOutOfMemory` with its advice, never a panic or an abort.
//!
//! Lavapipe backs "device" memory with host memory, so lowering this process's address-space
//! limit (`RLIMIT_AS`) after the device is up makes the driver's own allocation fail, the way a
//! full GPU's would, and wgpu reports it as out-of-memory. A test binary of its own: the limit
//! is process-wide.

mod common;

use webtensor::{ops, Error, Tensor};

/// Caps this process's address space at `bytes` (soft and hard limit alike).
fn limit_address_space(bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit only reads the struct passed to it.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    assert_eq!(rc, 0, "setrlimit(RLIMIT_AS) failed");
}

#[test]
fn a_driver_out_of_memory_is_a_typed_error_with_advice() {
    let Some(device) = common::wgpu() else { return };
    if !device
        .info()
        .device_name
        .to_lowercase()
        .contains("llvmpipe")
    {
        // Only a driver that allocates "device" memory from this process's address space can
        // be made to run out this way.
        eprintln!("skipping: the adapter is not lavapipe, so RLIMIT_AS cannot reach its memory");
        return;
    }
    const CHUNK: usize = 16 << 20; // 64 MiB of f32 per tensor
    let a = Tensor::zeros(&device, [CHUNK]).unwrap();
    // Compile the pipeline and touch the device's pools before the cap.
    assert_eq!(ops::add(&a, &a).unwrap().to_vec::<f32>().unwrap()[0], 0.0);

    let mapped = common::proc_status_bytes("VmSize").expect("VmSize in /proc/self/status");
    limit_address_space(mapped + (512 << 20));
    let mut kept = Vec::new();
    let mut outcome = None;
    for _ in 0..64 {
        match ops::add(&a, &a).and_then(|t| device.synchronize().map(|()| t)) {
            Ok(t) => kept.push(t),
            Err(e) => {
                outcome = Some(e);
                break;
            }
        }
    }
    drop(kept);
    limit_address_space(libc::RLIM_INFINITY);
    match outcome {
        Some(e @ Error::DeviceOutOfMemory { .. }) => {
            let text = e.to_string();
            eprintln!("{text}");
            assert!(text.contains("--resident-layers"), "no advice in: {text}");
            // The validation errors that follow from the failed allocation are noise here.
            assert!(
                !text.contains("is invalid"),
                "consequences in the message: {text}"
            );
        }
        Some(e) => panic!("expected DeviceOutOfMemory, got: {e}"),
        None => panic!("64 tensors of 64 MiB under a 512 MiB cap never ran out of memory"),
    }
}
