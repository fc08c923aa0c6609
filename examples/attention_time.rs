//! How long `ops::paged_attention` takes on a device over growing key counts, at SmolLM-135M's
//! heads (9 query heads, 3 key/value heads, head_dim 64): per call, the median of `RUNS`
//! batches of 30 calls (one per layer, as a token runs them) in µs of wall time, the CPU time
//! of the process per call (on a software adapter the adapter's threads are the process's),
//! and the largest difference from the reference backend. The row table is `COLUMNS` wide, the
//! most keys a replayed decode step reaches (a cache's capacity); 0 makes it as wide as the
//! keys, as a prompt chunk's table is. E.g. natively on SwiftShader:
//!
//! ```text
//! VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json WGPU_BACKEND=vulkan \
//!   cargo run --release --example attention_time -- [BACKEND [KEYS,... [QUERIES,... [COLUMNS]]]]
//! ```
//!
//! BACKEND defaults to wgpu, KEYS to 16,64,128,256,448, QUERIES to 1,4, COLUMNS to 464.
use std::time::Instant;

use webtensor::{ops, Device, Tensor};

const LAYERS: usize = 30;
const RUNS: usize = 5;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;

fn cpu_secs() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage for the call to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn list(s: Option<&String>, default: &str) -> Vec<usize> {
    s.map_or(default, |s| s.as_str())
        .split(',')
        .map(|x| x.parse().expect("a number"))
        .collect()
}

/// Values in [-1, 1], a fixed pattern per seed.
fn fill(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32 / 1e3 - 1.0)
        .collect()
}

/// The pool rows of `columns` positions of each key/value head (a pool of `slots` per head).
fn table(d: &Device, slots: usize, columns: usize) -> webtensor::Result<Tensor> {
    let rows: Vec<u32> = (0..KV_HEADS * columns)
        .map(|i| ((i / columns) * slots + i % columns) as u32)
        .collect();
    Tensor::from_vec(d, rows, [KV_HEADS, columns])
}

fn main() -> webtensor::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args.first().map_or("wgpu", String::as_str);
    let keys = list(args.get(1), "16,64,128,256,448");
    let queries = list(args.get(2), "1,4");
    let columns = list(args.get(3), "464")[0];
    let d = Device::new(backend)?;
    let r = Device::reference();
    let slots = columns.max(keys.iter().copied().max().unwrap_or(1));
    let pool_rows = KV_HEADS * slots;
    let pool = |d: &Device, seed| {
        Tensor::from_vec(d, fill(pool_rows * HEAD_DIM, seed), [pool_rows, HEAD_DIM])
    };
    let (k, v) = (pool(&d, 1)?, pool(&d, 2)?);
    let (k_ref, v_ref) = (pool(&r, 1)?, pool(&r, 2)?);
    let width = if columns == 0 {
        "as many columns as keys".to_string()
    } else {
        format!("{columns} columns")
    };
    println!(
        "{backend}: {HEADS}/{KV_HEADS} heads, head_dim {HEAD_DIM}, {width}; µs per call (median \
         of {RUNS} × {LAYERS}), CPU µs per call"
    );
    for &t in &queries {
        let q_host = fill(t * HEADS * HEAD_DIM, 3);
        let q = Tensor::from_vec(&d, q_host.clone(), [t, HEADS * HEAD_DIM])?;
        let q_ref = Tensor::from_vec(&r, q_host, [t, HEADS * HEAD_DIM])?;
        for &n in &keys {
            let cols = if columns == 0 { n } else { columns };
            let rows = table(&d, slots, cols)?;
            let run = || ops::paged_attention(&q, (&k, &v), (&rows, n), HEADS, 0.125, (None, None));
            let got = run()?.to_vec::<f32>()?;
            let rows_ref = table(&r, slots, cols)?;
            let want = ops::paged_attention(
                &q_ref,
                (&k_ref, &v_ref),
                (&rows_ref, n),
                HEADS,
                0.125,
                (None, None),
            )?
            .to_vec::<f32>()?;
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let mut wall = Vec::new();
            let cpu0 = cpu_secs();
            for _ in 0..RUNS {
                let start = Instant::now();
                let outs: Vec<Tensor> = (0..LAYERS)
                    .map(|_| run())
                    .collect::<webtensor::Result<_>>()?;
                d.synchronize()?;
                drop(outs);
                wall.push(start.elapsed().as_secs_f64() / LAYERS as f64);
            }
            let cpu = (cpu_secs() - cpu0) / (RUNS * LAYERS) as f64;
            wall.sort_by(f64::total_cmp);
            println!(
                "t={t} n={n}: {:.0} µs, cpu {:.0} µs (largest error {err:.1e})",
                1e6 * wall[RUNS / 2],
                1e6 * cpu
            );
        }
    }
    Ok(())
}
