//! Timing one case on one device, after checking its output against the reference.

use super::cases::{output_values, Case};
use super::clock::now_secs;
use super::{BenchConfig, BenchRow, Ceilings};
use crate::device::Device;
use crate::error::{Error, Result};

/// Relative tolerance of the sanity check (the conformance tests are far stricter).
const CHECK_TOLERANCE: f64 = 1e-3;

/// Checks `case` on `device` against `expected`, then times it. Each sample ends by waiting
/// for the device ([`Device::synchronize_async`], which does not block the browser).
pub(super) async fn time_case(
    device: &Device,
    case: &Case,
    expected: &[f32],
    ceilings: &Ceilings,
    config: &BenchConfig,
) -> Result<BenchRow> {
    let mut row = BenchRow {
        op: case.op,
        case: case.label.clone(),
        shape: case.shape(),
        backend: device.chain()[0],
        device: device.primary().info().device_name,
        checked: false,
        refused: false,
        median_us: None,
        min_us: None,
        bytes: case.bytes,
        flops: case.flops,
        elements: case.elements,
        gb_per_s: None,
        gflop_per_s: None,
        melem_per_s: None,
        frac_copy: None,
        frac_read: None,
        frac_peak: None,
        error: None,
    };
    // A case that does not fit the device (an operand beyond its binding limit at `--size
    // medium`, or beyond its memory, or activations it has no product of) is a row that says
    // why, and the other rows still run;
    // any other error ends the bench.
    let attempt = case
        .upload(device)
        .and_then(|inputs| Ok(((case.run)(&inputs)?, inputs)));
    let (output, inputs) = match attempt {
        Ok(ran) => ran,
        Err(reason) if does_not_fit(&reason) => return Ok(row.refused_by(reason)),
        Err(other) => return Err(other),
    };
    let got = output_values(&output).await?;
    if let Err(message) = check(&got, expected) {
        row.error = Some(message);
        return Ok(row);
    }
    row.checked = true;

    // Warm up (pipelines, pools, caches), then find an iteration count for one sample.
    let inputs = &inputs;
    let run_batch = move |iters: usize| async move {
        let start = now_secs();
        for _ in 0..iters {
            (case.run)(inputs)?;
        }
        device.synchronize_async().await?;
        Result::Ok(now_secs() - start)
    };
    run_batch(2).await?;
    let mut iters = 1usize;
    loop {
        let t = run_batch(iters).await?;
        if t >= config.min_sample_secs || iters >= 1 << 16 {
            break;
        }
        iters = (iters * 2)
            .max((iters as f64 * config.min_sample_secs / t.max(1e-9) * 1.2) as usize)
            .min(1 << 16);
    }
    let mut samples = Vec::with_capacity(config.runs.max(1));
    for _ in 0..config.runs.max(1) {
        samples.push(run_batch(iters).await? / iters as f64);
    }
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    row.median_us = Some(median * 1e6);
    row.min_us = Some(samples[0] * 1e6);
    let gb = case.bytes as f64 / median / 1e9;
    row.gb_per_s = Some(gb);
    row.frac_copy = Some(gb / ceilings.copy_gb_per_s);
    row.frac_read = ceilings.read_gb_per_s.map(|read| gb / read);
    if case.elements > 0 {
        row.melem_per_s = Some(case.elements as f64 / median / 1e6);
    }
    if case.flops > 0 {
        let gflops = case.flops as f64 / median / 1e9;
        row.gflop_per_s = Some(gflops);
        row.frac_peak = ceilings.fma_gflop_per_s.map(|peak| gflops / peak);
    }
    Ok(row)
}

/// Whether `e` says a case does not fit the device: a limit of the device, or activations it
/// has no product of with a block format, not a fault.
fn does_not_fit(e: &Error) -> bool {
    matches!(
        e,
        Error::TensorTooLarge { .. }
            | Error::OutOfMemory { .. }
            | Error::DeviceOutOfMemory { .. }
            | Error::ActivationsUnsupported { .. }
    )
}

fn check(got: &[f32], want: &[f32]) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "output has {} elements, the reference {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w as f64).abs();
        // Written so that a NaN error fails the check too.
        if err.is_nan() || err > CHECK_TOLERANCE * scale {
            return Err(format!("element {i}: got {g}, reference {w}"));
        }
    }
    Ok(())
}
