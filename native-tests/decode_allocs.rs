//! Heap allocations per cpu decode step, counted by a global allocator that wraps the system
//! one: how many, how many bytes, and how many of at least 128 KiB (glibc maps those with
//! `mmap` and unmaps them on free, so each costs page faults every step: the profile in
//! docs/cpu-decode-profile.md shows them). It prints the counts for the profile and holds them
//! to a budget, so a change that adds per-step allocations fails here.
//!
//! `WEBTENSOR_ALLOC_MODEL=path.gguf cargo test --release --test decode_allocs -- --nocapture`
//! counts on another model (e.g. a TinyLlama-shape Q4_0) and prints, without the budget.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use webtensor::Device;
use webtensor_llm::{builtin, Llama, ModelFiles};

/// glibc's default mmap threshold.
const LARGE: usize = 128 * 1024;

static COUNT: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);
static LARGE_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Allocations by size class: entry `i` counts sizes in `2^(i-1)+1 ..= 2^i` (the last, all
/// larger ones).
static BY_SIZE: [AtomicUsize; 40] = [const { AtomicUsize::new(0) }; 40];

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn note(size: usize) {
    COUNT.fetch_add(1, Relaxed);
    BYTES.fetch_add(size, Relaxed);
    if size >= LARGE {
        LARGE_COUNT.fetch_add(1, Relaxed);
    }
    BY_SIZE[(size.next_power_of_two().trailing_zeros() as usize).min(39)].fetch_add(1, Relaxed);
}

fn by_size() -> Vec<usize> {
    BY_SIZE.iter().map(|c| c.load(Relaxed)).collect()
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations, bytes and large allocations so far.
fn counts() -> [usize; 3] {
    [
        COUNT.load(Relaxed),
        BYTES.load(Relaxed),
        LARGE_COUNT.load(Relaxed),
    ]
}

/// Per-step averages over `steps` decode steps after a prompt and one warm-up step.
fn per_step(model: &Llama, steps: usize) -> [usize; 3] {
    let mut cache = model.new_cache(64).unwrap();
    model.forward(&[1, 2, 3, 4], &mut cache).unwrap();
    model.forward(&[5], &mut cache).unwrap();
    let sizes_before = by_size();
    let before = counts();
    for t in 0..steps as u32 {
        // The logits tensor is dropped inside the window, as a caller's would be.
        drop(model.forward(&[6 + t], &mut cache).unwrap());
    }
    let after = counts();
    for (i, (a, b)) in by_size().iter().zip(sizes_before).enumerate() {
        if a > &b {
            println!(
                "  sizes up to {:>9} bytes: {:>6} per step",
                1usize << i,
                (a - b) / steps
            );
        }
    }
    [0, 1, 2].map(|i| (after[i] - before[i]) / steps)
}

#[test]
fn a_cpu_decode_step_allocates_within_its_budget() {
    let device = Device::cpu();
    let external = std::env::var_os("WEBTENSOR_ALLOC_MODEL");
    let files = match &external {
        Some(path) => ModelFiles::open(std::path::Path::new(path)).unwrap(),
        None => builtin::files().unwrap(),
    };
    let model = Llama::load(&device, files).unwrap();
    let [count, bytes, large] = per_step(&model, 8);
    println!(
        "cpu decode step ({}): {count} allocations, {bytes} bytes, {large} of >= 128 KiB",
        external
            .as_ref()
            .map_or("built-in model".into(), |p| p.to_string_lossy())
    );
    if external.is_some() {
        return;
    }
    // The budget: what a step took when this test was written (built-in model: 1509
    // allocations, 0.93 MB, none large; SmolLM-135M shape Q4_0: 8991, 2.6 MB, 1 large, the
    // logits; TinyLlama-1.1B shape Q4_0: 7817, 6.1 MB, none), with headroom for small changes.
    // An arena for the outputs of a forward pass should bring these well down; lower it then.
    assert!(count <= BUDGET_COUNT, "{count} allocations per step");
    assert!(bytes <= BUDGET_BYTES, "{bytes} bytes allocated per step");
    assert_eq!(large, 0, "allocations of >= 128 KiB per step");
}

const BUDGET_COUNT: usize = 1800;
const BUDGET_BYTES: usize = 1_200_000;
