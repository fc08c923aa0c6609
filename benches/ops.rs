//! Criterion micro-benchmarks of the hottest ops on each present backend.
//!
//! GPU work is recorded lazily, so every measurement records its iterations and then waits for
//! the device before the clock stops (`iter_custom` + `Device::synchronize`).
//! Run with `cargo bench` (`cargo bench --features cuda` adds the cuda backend where a CUDA
//! device exists); `webtensor bench` gives the full table with ceilings.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use webtensor::{ops, Device, Tensor};

/// cpu, then each GPU backend that is present (cuda only when built with `--features cuda`).
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    for name in ["wgpu", "cuda"] {
        match Device::new(name) {
            Ok(d) => devices.push(d),
            Err(e) => eprintln!("{name} not benchmarked: {e}"),
        }
    }
    devices
}

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn tensor(dev: &Device, shape: &[usize]) -> Tensor {
    Tensor::from_vec(dev, values(shape.iter().product()), shape).expect("bench tensor")
}

/// Times `iters` runs of `op`, waiting for the device at the end.
fn timed(dev: &Device, iters: u64, op: impl Fn() -> webtensor::Result<Tensor>) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        op().expect("bench op");
    }
    dev.synchronize().expect("synchronize");
    start.elapsed()
}

fn bench_ops(c: &mut Criterion) {
    let (d, ffn, seq) = (1024, 2816, 32);
    for dev in devices() {
        let name = dev.backend_name();
        let mut group = c.benchmark_group(format!("ops/{name}"));
        group
            .sample_size(20)
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(500));

        let x1 = tensor(&dev, &[1, d]);
        let w = tensor(&dev, &[ffn, d]);
        group.throughput(Throughput::Bytes((ffn * d * 4) as u64));
        group.bench_function(format!("matvec 1x{d}·{ffn}x{d}ᵀ"), |b| {
            b.iter_custom(|iters| timed(&dev, iters, || ops::matmul_t(&x1, &w)))
        });

        let xs = tensor(&dev, &[seq, d]);
        group.throughput(Throughput::Elements((2 * seq * d * ffn) as u64));
        group.bench_function(format!("matmul {seq}x{d}·{ffn}x{d}ᵀ"), |b| {
            b.iter_custom(|iters| timed(&dev, iters, || ops::matmul_t(&xs, &w)))
        });

        let g = tensor(&dev, &[d]);
        group.throughput(Throughput::Bytes((2 * seq * d * 4) as u64));
        group.bench_function(format!("rms_norm {seq}x{d}"), |b| {
            b.iter_custom(|iters| timed(&dev, iters, || ops::rms_norm(&xs, &g, 1e-6)))
        });
        group.bench_function(format!("softmax {seq}x{d}"), |b| {
            b.iter_custom(|iters| timed(&dev, iters, || ops::softmax(&xs)))
        });
        group.finish();
    }
}

criterion_group!(benches, bench_ops);
criterion_main!(benches);
