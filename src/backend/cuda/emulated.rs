//! The backend's own launch code (`launcher.rs`: arguments, grids, scratch buffers) driving the
//! CUDA kernels compiled for the CPU by `native-tests/cuda_host/emulate.py --build DIR`, each
//! op's result compared with the `reference` backend. Runs where `WEBTENSOR_CUDA_EMULATION`
//! names that folder (`scripts/test.sh` sets it); elsewhere it prints that it skipped.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::Arc;

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::launcher::{copy_into, launch, launch_in_place, write, Arg, Launcher, BLOCK};
use crate::backend::kernel_consts::decodes_groups;
use crate::backend::reference::ReferenceBackend;
use crate::backend::BackendKind;
use crate::backend::{
    Activations, AttentionSpec, Backend, BinaryOp, HostData, LinearSpec, MatmulSpec, OpSpec,
    PreNorm, RopeEpilogue, RopeLayout, SampleParams, ScanOp, Storage, UnaryOp,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Host memory standing in for device memory; kernels write it through its address.
struct EmuBuffer {
    words: UnsafeCell<Box<[u64]>>,
    len: usize,
    dtype: DType,
}

impl EmuBuffer {
    fn new(len: usize, dtype: DType) -> Self {
        let bytes = len * dtype.unit_bytes();
        EmuBuffer {
            words: UnsafeCell::new(vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice()),
            len,
            dtype,
        }
    }

    fn from_host(h: &HostData) -> Self {
        let b = EmuBuffer::new(h.len(), h.dtype());
        // SAFETY: no kernel runs while the buffer is being filled.
        let words = unsafe { &mut *b.words.get() };
        bytemuck::cast_slice_mut::<u64, u8>(words)[..h.bytes().len()].copy_from_slice(h.bytes());
        b
    }

    fn to_host(&self) -> HostData {
        // SAFETY: launches are synchronous here, so no kernel is writing.
        let words = unsafe { &*self.words.get() };
        let bytes = &bytemuck::cast_slice::<u64, u8>(words)[..self.len * self.dtype.unit_bytes()];
        match self.dtype {
            DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(bytes)),
            DType::U32 => HostData::U32(bytemuck::pod_collect_to_vec(bytes)),
            d => HostData::Bytes(d, bytes.to_vec().into()),
        }
    }
}

type LaunchFn = unsafe extern "C" fn(u32, u32, u32, u32, *mut *mut c_void);

/// The null address [`Arg::KeysAt`] is outside a replayed step.
static NULL: u64 = 0;

/// The kernels compiled for the CPU, one library per source file.
struct Emulator {
    libs: Vec<libloading::Library>,
}

impl Emulator {
    fn open() -> Option<Emulator> {
        let Some(dir) = std::env::var_os("WEBTENSOR_CUDA_EMULATION") else {
            eprintln!(
                "SKIPPED: set WEBTENSOR_CUDA_EMULATION to the folder of \
                 `native-tests/cuda_host/emulate.py --build DIR`"
            );
            return None;
        };
        let dir = std::path::PathBuf::from(dir);
        let libs = super::sources::SOURCES
            .iter()
            .map(|s| {
                let path = dir.join(format!("{}.so", s.name));
                // SAFETY: the library is the kernels compiled by emulate.py; loading runs no
                // initialisers of concern.
                unsafe { libloading::Library::new(&path) }
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            })
            .collect();
        Some(Emulator { libs })
    }
}

impl Launcher for Emulator {
    type Buffer = EmuBuffer;

    fn ptr(&self, b: &EmuBuffer) -> u64 {
        // SAFETY: only the address is taken.
        unsafe { (*b.words.get()).as_mut_ptr() as u64 }
    }

    fn dtype(&self, b: &EmuBuffer) -> DType {
        b.dtype
    }

    fn len(&self, b: &EmuBuffer) -> usize {
        b.len
    }

    fn write_bytes(&self, dst: u64, data: &[u8]) -> Result<()> {
        // SAFETY: `dst` is an EmuBuffer's address with room for `data` (the launch code
        // checks the lengths); nothing else runs meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        Ok(())
    }

    fn copy_bytes(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        // SAFETY: as for `write_bytes`; the launch code copies between distinct buffers.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn scratch(&self, _op: &'static str, len: usize, dtype: DType) -> Result<EmuBuffer> {
        Ok(EmuBuffer::new(len, dtype))
    }

    fn run(&self, name: &'static str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        let symbol = format!("wt_launch_{name}");
        let f = self
            .libs
            .iter()
            // SAFETY: every wt_launch_* wrapper has the LaunchFn signature (emulate.py).
            .find_map(|l| {
                unsafe { l.get::<LaunchFn>(symbol.as_bytes()) }
                    .ok()
                    .map(|s| *s)
            })
            .ok_or_else(|| {
                Error::backend(BackendKind::Cuda, format!("no emulated kernel {name}"))
            })?;
        let mut argv: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *mut c_void,
                Arg::U32(v) => v as *const u32 as *mut c_void,
                Arg::F32(v) => v as *const f32 as *mut c_void,
                Arg::KeysAt => &NULL as *const u64 as *mut c_void,
            })
            .collect();
        // The emulation keeps the grid and its barriers in globals of each library, which
        // every test of the process shares: one launch at a time.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the wrapper reads each argument with the type the kernel declares; the
        // launch code passes the kernels' parameter lists (`signatures.rs` checks it does).
        unsafe { f(grid.0, grid.1, grid.2, BLOCK, argv.as_mut_ptr()) };
        Ok(())
    }
}

struct Inputs(StdRng);

impl Inputs {
    fn f32(&mut self, n: usize, lo: f32, hi: f32) -> HostData {
        HostData::F32((0..n).map(|_| self.0.random_range(lo..hi)).collect())
    }

    fn packed(&mut self, format: DType, n: usize) -> HostData {
        let x: Vec<f32> = (0..n).map(|_| self.0.random_range(-2.0..2.0)).collect();
        self.encoded(format, &x)
    }

    /// `x` in `format`: quantized where webtensor has the format's quantizer, `BF16` the high
    /// halves of its f32s, else (llama.cpp's K-quants and `IQ4` formats) random blocks whose
    /// f16 scales are set to 0.01 (any bytes are valid quants).
    fn encoded(&mut self, format: DType, x: &[f32]) -> HostData {
        let mut out = vec![0u8; x.len() / format.block_len() * format.block_bytes()];
        match crate::quant::format(format) {
            _ if format == DType::BF16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
                }
            }
            Some(f) if f.quantize.is_none() => {
                self.0.fill(&mut out[..]);
                let scale = crate::quant::f16_bits(0.01).to_le_bytes();
                for block in out.chunks_exact_mut(format.block_bytes()) {
                    for &at in f.f16_scales {
                        block[at..at + 2].copy_from_slice(&scale);
                    }
                }
            }
            _ => crate::quant::quantize(format, x, &mut out),
        }
        HostData::Bytes(format, out.into())
    }
}

/// Every op at small awkward shapes, with its inputs.
pub(super) fn cases() -> Vec<(OpSpec, Vec<HostData>)> {
    let mut r = Inputs(StdRng::seed_from_u64(11));
    let mut c: Vec<(OpSpec, Vec<HostData>)> = Vec::new();
    for op in [
        UnaryOp::Silu,
        UnaryOp::GeluTanh,
        UnaryOp::GeluErf,
        UnaryOp::Sigmoid,
        UnaryOp::Scale(-0.37),
        UnaryOp::Softcap(2.5),
    ] {
        c.push((
            OpSpec::Unary { op, len: 1000 },
            vec![r.f32(1000, -6.0, 6.0)],
        ));
    }
    for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::SwiGlu] {
        let spec = OpSpec::Binary {
            op,
            len: 1000,
            rhs_len: 10,
        };
        c.push((spec, vec![r.f32(1000, -3.0, 3.0), r.f32(10, -3.0, 3.0)]));
    }
    let (rows, cols) = (3, 300);
    let x = r.f32(rows * cols, 2.0, 8.0);
    let w = r.f32(cols, -2.0, 2.0);
    let spec = OpSpec::RmsNorm {
        rows,
        cols,
        eps: 1e-6,
    };
    c.push((spec, vec![x.clone(), w.clone()]));
    let spec = OpSpec::LayerNorm {
        rows,
        cols,
        eps: 1e-5,
    };
    c.push((spec, vec![x, w, r.f32(cols, -1.0, 1.0)]));
    for causal in [None, Some(3)] {
        let spec = OpSpec::Softmax {
            rows: 6,
            cols: 50,
            causal,
        };
        c.push((spec, vec![r.f32(300, -5.0, 5.0)]));
    }
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        let spec = OpSpec::Rope {
            rows: 3,
            heads: 2,
            head_dim: 8,
            layout,
        };
        c.push((
            spec,
            vec![
                r.f32(48, -1.0, 1.0),
                HostData::U32(vec![0, 5, 17]),
                HostData::F32(crate::ops::rope_inv_freq(10_000.0, 8)),
            ],
        ));
    }
    for (batch, m, n, k, rhs_transposed, rhs_batched) in [
        (2, 1, 70, 33, true, false),
        (2, 1, 9, 100, false, true),
        (2, 5, 67, 40, false, true),
        (1, 65, 3, 129, true, false),
    ] {
        let spec = MatmulSpec {
            batch,
            m,
            n,
            k,
            rhs_transposed,
            rhs_batched,
        };
        let rb = if rhs_batched { batch } else { 1 };
        let inputs = vec![
            r.f32(batch * m * k, -1.0, 1.0),
            r.f32(rb * n * k, -1.0, 1.0),
        ];
        c.push((OpSpec::Matmul(spec), inputs));
    }
    let spec = OpSpec::Embedding {
        vocab: 10,
        dim: 5,
        count: 4,
        format: DType::F32,
    };
    c.push((
        spec,
        vec![r.f32(50, -1.0, 1.0), HostData::U32(vec![3, 0, 11, 9])],
    ));
    let permute = OpSpec::Permute {
        in_shape: vec![2, 3, 4, 5],
        perm: vec![2, 0, 3, 1],
    };
    c.push((permute.clone(), vec![r.f32(120, -1.0, 1.0)]));
    c.push((permute, vec![HostData::U32((0..120).collect())]));
    let spec = OpSpec::Concat {
        rows: 3,
        a_cols: 4,
        b_cols: 2,
    };
    c.push((spec, vec![r.f32(12, -1.0, 1.0), r.f32(6, -1.0, 1.0)]));
    let spec = OpSpec::Narrow {
        rows: 3,
        cols: 4,
        start: 1,
        len: 2,
    };
    c.push((spec, vec![HostData::U32((0..12).collect())]));
    c.push((
        OpSpec::Argmax { rows: 3, cols: 257 },
        vec![r.f32(771, -1.0, 1.0)],
    ));
    let (n, k) = (3, 512);
    for format in crate::backend::kernel_consts::PACKED_FORMATS.map(|f| f.dtype) {
        if super::launch::quant::QUANTIZES.contains(&format) {
            let spec = OpSpec::Quantize {
                format,
                rows: 2,
                cols: 512,
            };
            c.push((spec, vec![r.f32(1024, -2.0, 2.0)]));
        }
        let spec = OpSpec::Dequantize {
            format,
            rows: 2,
            cols: 512,
        };
        c.push((spec, vec![r.packed(format, 1024)]));
        for activations in [
            Activations::F32,
            Activations::F16,
            Activations::Q8_0,
            Activations::I8,
            Activations::Q8_K,
        ] {
            let m = 2;
            let a = match activations {
                Activations::F16 => r.packed(DType::F16, m * k),
                _ => r.f32(m * k, -1.0, 1.0),
            };
            let spec = OpSpec::QMatmul {
                format,
                activations,
                m,
                n,
                k,
            };
            c.push((spec, vec![a, r.packed(format, n * k)]));
        }
        if format.is_ternary() {
            let x: Vec<u8> = (0..2 * k).map(|_| r.0.random::<u8>()).collect();
            let spec = OpSpec::TernaryDot { format, m: 2, n, k };
            c.push((
                spec,
                vec![
                    r.packed(format, n * k),
                    HostData::Bytes(DType::I8, x.into()),
                ],
            ));
        }
    }
    let (outer, len, inner) = (2, 40, 3);
    let t = outer * len * inner;
    let a = r.f32(t, 0.5, 1.0);
    let scans = [
        (
            ScanOp::Linear,
            vec![a.clone(), r.f32(t, -1.0, 1.0), r.f32(6, -1.0, 1.0)],
        ),
        (ScanOp::LinearAdjoint, vec![a.clone(), r.f32(t, -1.0, 1.0)]),
        (ScanOp::LogCumprod, vec![a.clone()]),
        (ScanOp::LogCumSumExp, vec![r.f32(t, -5.0, 5.0)]),
    ];
    for (op, inputs) in scans {
        let spec = OpSpec::Scan {
            op,
            outer,
            len,
            inner,
        };
        c.push((spec, inputs));
    }
    let spec = OpSpec::ScanGradA { outer, len, inner };
    c.push((
        spec,
        vec![
            r.f32(t, -1.0, 1.0),
            r.f32(t, -1.0, 1.0),
            r.f32(6, -1.0, 1.0),
        ],
    ));
    let spec = OpSpec::ScanGradInit { outer, len, inner };
    c.push((spec, vec![a, r.f32(t, -1.0, 1.0)]));
    for (temperature, top_k, top_p) in [(0.0, 0, 1.0), (0.8, 40, 0.9), (1.0, 0, 0.5)] {
        let spec = OpSpec::Sample {
            rows: 3,
            vocab: 500,
            params: SampleParams {
                temperature,
                top_k,
                top_p,
            },
        };
        c.push((spec, vec![r.f32(1500, -4.0, 4.0), r.f32(3, 0.0, 1.0)]));
    }
    c
}

fn host(h: &HostData) -> Storage {
    Storage::Host(Arc::new(h.clone()))
}

/// The tolerance of docs/DESIGN.md: 1e-5, times sqrt(k) for products of k terms.
fn tolerance(spec: &OpSpec) -> f32 {
    match spec {
        OpSpec::Matmul(m) => 1e-5 * (m.k as f32).sqrt(),
        OpSpec::QMatmul { k, .. } => 1e-5 * (*k as f32).sqrt(),
        _ => 1e-5,
    }
}

/// Exact for integers and bytes; f32 within `tol · max(1, max|want|)`, NaN where NaN.
fn assert_same(what: &str, got: &HostData, want: &HostData, tol: f32) {
    match (got, want) {
        (HostData::F32(g), HostData::F32(w)) => {
            assert_eq!(g.len(), w.len(), "{what}: length");
            let scale = w
                .iter()
                .filter(|v| v.is_finite())
                .fold(1f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * scale;
                assert!(ok, "{what}: element {i}: got {a}, want {b}");
            }
        }
        _ => assert_eq!(got, want, "{what}"),
    }
}

#[test]
fn launches_match_the_reference_on_the_emulated_kernels() {
    let Some(emu) = Emulator::open() else {
        return;
    };
    for (spec, inputs) in cases() {
        let what = format!("{spec:?}");
        let storages: Vec<Storage> = inputs.iter().map(host).collect();
        let refs: Vec<&Storage> = storages.iter().collect();
        let want = ReferenceBackend.execute(&spec, &refs).expect(&what);
        let bufs: Vec<EmuBuffer> = inputs.iter().map(EmuBuffer::from_host).collect();
        let buf_refs: Vec<&EmuBuffer> = bufs.iter().collect();
        let out = EmuBuffer::new(spec.output_len(), spec.output_dtype(inputs[0].dtype()));
        launch(&emu, &spec, &out, &buf_refs).expect(&what);
        let tol = tolerance(&spec);
        assert_same(
            &what,
            &out.to_host(),
            want.as_host().expect("host data"),
            tol,
        );
    }
}

#[test]
fn scatter_rows_in_place_matches_the_reference() {
    let Some(emu) = Emulator::open() else {
        return;
    };
    let spec = OpSpec::ScatterRows {
        rows: 5,
        cols: 3,
        count: 3,
    };
    let target = HostData::F32((0..15).map(|v| v as f32).collect());
    let src = HostData::F32((0..9).map(|v| 100.0 + v as f32).collect());
    let slots = HostData::U32(vec![4, 7, 1]);
    let mut want = host(&target);
    ReferenceBackend
        .write_into(&spec, &mut [&mut want], &[&host(&src), &host(&slots)])
        .expect("reference scatter");
    let t = EmuBuffer::from_host(&target);
    let (s, sl) = (EmuBuffer::from_host(&src), EmuBuffer::from_host(&slots));
    launch_in_place(&emu, &spec, &t, &[&s, &sl]).expect("emulated scatter");
    assert_same(
        "scatter_rows",
        &t.to_host(),
        want.as_host().expect("host"),
        0.0,
    );
}

/// `write` overwrites a buffer in place, whatever its dtype (bytes of a packed one, an odd
/// count of them included); a write of another length or dtype is refused and changes nothing.
#[test]
fn write_overwrites_the_buffer_in_place() {
    let Some(emu) = Emulator::open() else {
        return;
    };
    let target = EmuBuffer::from_host(&HostData::F32(vec![1.0; 7]));
    let address = emu.ptr(&target);
    let data = HostData::F32((0..7).map(|v| v as f32 * 0.5).collect());
    write(&emu, &target, &data).expect("write");
    assert_eq!(target.to_host(), data);
    assert_eq!(emu.ptr(&target), address, "the same memory");
    let bytes = EmuBuffer::from_host(&HostData::Bytes(DType::I8, vec![0; 5].into()));
    let data = HostData::Bytes(DType::I8, vec![1, 2, 3, 4, 5].into());
    write(&emu, &bytes, &data).expect("write bytes");
    assert_eq!(bytes.to_host(), data);
    assert!(write(&emu, &target, &HostData::F32(vec![0.0; 6])).is_err());
    assert!(write(&emu, &target, &HostData::U32(vec![0; 7])).is_err());
    assert_eq!(target.to_host().as_f32().unwrap()[6], 3.0);
    let empty = EmuBuffer::new(0, DType::U32);
    write(&emu, &empty, &HostData::U32(Vec::new())).expect("an empty write");
}

/// `copy_into` copies a region between buffers at unit offsets, leaving the rest, and
/// refuses ranges past either buffer and mixed dtypes.
#[test]
fn copy_into_copies_a_region_in_place() {
    let Some(emu) = Emulator::open() else {
        return;
    };
    let src = EmuBuffer::from_host(&HostData::U32((100..113).collect()));
    let target = EmuBuffer::from_host(&HostData::U32((0..9).collect()));
    copy_into(&emu, (&src, 11), (&target, 2), 2).expect("copy");
    copy_into(&emu, (&src, 0), (&target, 8), 1).expect("copy the last unit");
    copy_into(&emu, (&src, 13), (&target, 9), 0).expect("an empty copy at the ends");
    assert_eq!(
        target.to_host(),
        HostData::U32(vec![0, 1, 111, 112, 4, 5, 6, 7, 100])
    );
    assert!(copy_into(&emu, (&src, 12), (&target, 0), 2).is_err());
    assert!(copy_into(&emu, (&src, 0), (&target, 8), 2).is_err());
    assert!(copy_into(&emu, (&src, usize::MAX), (&target, 0), 2).is_err());
    let floats = EmuBuffer::from_host(&HostData::F32(vec![0.0; 9]));
    assert!(copy_into(&emu, (&src, 0), (&floats, 0), 1).is_err());
    assert_eq!(
        target.to_host(),
        HostData::U32(vec![0, 1, 111, 112, 4, 5, 6, 7, 100])
    );
}

/// A fused op's case: its spec, inputs, the target of an in-place op, and its tolerance
/// (docs/DESIGN.md) relative to the largest expected value.
pub(super) struct FusedCase {
    pub(super) spec: OpSpec,
    pub(super) inputs: Vec<HostData>,
    pub(super) target: Option<HostData>,
    tol: f32,
}

/// The largest magnitude of `v`.
fn largest(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// A weight `[n, k]` of `format` from uniform values in `[-1, 1)`: f32 as it is, else packed.
fn weight(r: &mut Inputs, format: DType, n: usize, k: usize) -> HostData {
    let w = r.f32(n * k, -1.0, 1.0);
    if format == DType::F32 {
        return w;
    }
    r.encoded(format, w.as_f32().expect("f32"))
}

/// The largest magnitude of a weight's values.
fn weight_max(w: &HostData) -> f32 {
    match w {
        HostData::Bytes(format, bytes) => {
            let mut values = vec![0f32; bytes.len() / format.block_bytes() * format.block_len()];
            crate::quant::dequantize(*format, bytes, &mut values);
            largest(&values)
        }
        other => largest(other.as_f32().expect("f32 weight")),
    }
}

/// The rows `x` `[m, k]` RMS-normed with `w` on the reference.
fn normed(x: &HostData, w: &HostData, m: usize, k: usize, eps: f32) -> Vec<f32> {
    let spec = OpSpec::RmsNorm {
        rows: m,
        cols: k,
        eps,
    };
    let out = ReferenceBackend
        .execute(&spec, &[&host(x), &host(w)])
        .expect("rms_norm");
    out.as_host()
        .and_then(HostData::as_f32)
        .expect("f32")
        .to_vec()
}

/// Weight formats with the activation modes the fused products take with each.
fn fused_formats() -> Vec<(DType, Activations)> {
    let mut out = vec![
        (DType::F32, Activations::F32),
        (DType::F16, Activations::F32),
    ];
    for f in [
        DType::Q4_0,
        DType::Q8_0,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::TernaryPlanes,
    ] {
        out.extend([Activations::F32, Activations::Q8_0, Activations::I8].map(|a| (f, a)));
    }
    // llama.cpp's other formats with f32 activations and the rounding the engine gives them;
    // bf16 with f32 ones.
    for f in crate::backend::kernel_consts::PACKED_FORMATS.map(|f| f.dtype) {
        if !decodes_groups(f) {
            continue;
        }
        out.push((f, Activations::F32));
        if f.is_quantized() {
            let int = if crate::quant::kquants::is_super_block(f) {
                Activations::Q8_K
            } else {
                Activations::Q8_0
            };
            out.push((f, int));
        }
    }
    out
}

/// The fused decode ops at awkward sizes: decode rows (activations prepared by each block),
/// rows past a warp's eight, and rows past what a block prepares itself (`fused_prepare`
/// first); every weight format and activation mode; both rope pairings; pool slots past
/// the pool; attention with GQA, windows, more keys than a chunk, row tables wider than the
/// keys (columns past the pool, never read), heads of 16, 72 (three value groups) and 300
/// values (wider than a block).
pub(super) fn fused_cases() -> Vec<FusedCase> {
    let mut r = Inputs(StdRng::seed_from_u64(29));
    let mut c = Vec::new();
    let eps = 0.25;
    let product = |format, activations, m, n, k| LinearSpec {
        format,
        activations,
        m,
        n,
        k,
        norm: None,
        rope: None,
    };
    // The allowance for int8 roundings of normed values that land on the other integer:
    // 2 · (largest normed / 127) · `reach`, relative to the largest expected `scale`.
    let flips = |act: Activations, normed: &[f32], reach: f32, scale: f32| {
        if act == Activations::F32 {
            0.0
        } else {
            2.0 * largest(normed) / 127.0 * reach / scale.max(1.0)
        }
    };
    let want_max = |spec: &OpSpec, inputs: &[HostData]| -> f32 {
        let storages: Vec<Storage> = inputs.iter().map(host).collect();
        let refs: Vec<&Storage> = storages.iter().collect();
        let out = ReferenceBackend.execute(spec, &refs).expect("reference");
        largest(out.as_host().and_then(HostData::as_f32).expect("f32"))
    };
    // (op, weight format, activations, (m, n, k)): every format and activation mode through
    // the plainest op at a decode row; the others over a spread of them, at rows a block
    // prepares itself and (m · k past 16384) rows `fused_prepare` prepares first.
    use Activations::{F32 as A32, I8 as AI8, Q8_0 as AQ8, Q8_K as AQ8K};
    type Row = (&'static str, DType, Activations, (usize, usize, usize));
    let mut table: Vec<Row> = fused_formats()
        .into_iter()
        .map(|(f, a)| ("residual", f, a, (1, 5, 256)))
        .collect();
    let prepared = (9, 6, 2048);
    table.extend([
        ("norm", DType::Q4_0, AQ8, (3, 17, 512)),
        ("norm", DType::Q4_0, AI8, (3, 17, 512)),
        ("norm", DType::Q8_0, AQ8, (3, 17, 512)),
        ("norm", DType::Q8_0, A32, (3, 17, 512)),
        ("norm", DType::TQ1_0, AI8, (3, 17, 512)),
        ("norm", DType::TernaryPlanes, AQ8, (3, 17, 512)),
        ("norm", DType::TQ2_0, A32, (3, 17, 512)),
        ("norm", DType::F16, A32, (3, 17, 512)),
        ("norm", DType::F32, A32, (3, 17, 512)),
        ("norm", DType::Q4_0, AQ8, prepared),
        ("norm", DType::Q8_0, AI8, prepared),
        ("norm", DType::F16, A32, prepared),
        ("norm", DType::F32, A32, prepared),
        ("swiglu normed", DType::Q4_0, AQ8, (1, 5, 256)),
        ("swiglu normed", DType::Q8_0, AI8, (1, 5, 256)),
        ("swiglu normed", DType::TQ2_0, AQ8, (3, 17, 512)),
        ("swiglu normed", DType::F16, A32, (3, 17, 512)),
        ("swiglu normed", DType::Q4_0, AQ8, prepared),
        ("swiglu", DType::Q4_0, A32, (3, 17, 512)),
        ("swiglu", DType::TQ1_0, AQ8, (1, 5, 256)),
        ("swiglu", DType::F32, A32, (1, 5, 256)),
        ("residual", DType::Q8_0, AI8, prepared),
        ("residual", DType::TQ2_0, A32, prepared),
        ("residual", DType::Q4_0, AQ8, (3, 17, 512)),
        ("norm", DType::Q4_K, AQ8K, (3, 17, 512)),
        ("norm", DType::Q2_K, A32, (3, 17, 512)),
        ("norm", DType::Q6_K, AQ8K, prepared),
        ("norm", DType::Q5_1, AQ8, prepared),
        ("swiglu normed", DType::Q3_K, AQ8K, (3, 17, 512)),
        ("swiglu normed", DType::Q5_0, AQ8, (3, 17, 512)),
        ("residual", DType::IQ4_XS, AQ8K, prepared),
        ("residual", DType::Q5_K, A32, prepared),
    ]);
    for (op, format, act, (m, n, k)) in table {
        let x = r.f32(m * k, -2.0, 2.0);
        let nw = r.f32(k, -1.5, 1.5);
        let h = normed(&x, &nw, m, k, eps);
        let (w, w2) = (weight(&mut r, format, n, k), weight(&mut r, format, n, k));
        let base = 1e-5 * (k as f32).sqrt();
        let mut l = product(format, act, m, n, k);
        let case = match op {
            "residual" => FusedCase {
                spec: OpSpec::LinearResidual(l),
                inputs: vec![x, w, r.f32(m * n, -3.0, 3.0)],
                target: None,
                tol: base,
            },
            "norm" => {
                l.norm = Some(PreNorm { eps });
                let spec = OpSpec::NormLinear(l);
                let inputs = vec![x, w.clone(), nw];
                let tol = base + flips(act, &h, weight_max(&w), want_max(&spec, &inputs));
                FusedCase {
                    spec,
                    inputs,
                    target: None,
                    tol,
                }
            }
            "swiglu" => FusedCase {
                spec: OpSpec::SwigluLinear(l),
                inputs: vec![x, w, w2],
                target: None,
                tol: 2.0 * base,
            },
            _ => {
                l.norm = Some(PreNorm { eps });
                let spec = OpSpec::SwigluLinear(l);
                // One unit moves silu(g)·u by at most its step times |u|·max silu' +
                // |silu(g)| (max silu' < 1.1): 2.2 times the largest product.
                let plain = OpSpec::LinearResidual(product(format, act, m, n, k));
                let zeros = HostData::F32(vec![0.0; m * n]);
                let of = |w: &HostData| {
                    want_max(
                        &plain,
                        &[HostData::F32(h.clone()), w.clone(), zeros.clone()],
                    )
                };
                let reach = 2.2 * of(&w).max(of(&w2));
                let inputs = vec![x, w, w2, nw];
                let tol = 2.0 * base + flips(act, &h, reach, want_max(&spec, &inputs));
                FusedCase {
                    spec,
                    inputs,
                    target: None,
                    tol,
                }
            }
        };
        c.push(case);
    }
    // Normed products with a rope, and stored into pool rows: (m, n, k, head_dim), the
    // weight, and (rope pairing, into the pool) of each case.
    let interleaved = Some(RopeLayout::Interleaved);
    let half = Some(RopeLayout::HalfSplit);
    for ((m, n, k, hd), format, act, variants) in [
        (
            (1, 32, 256, 16),
            DType::Q4_0,
            AQ8,
            vec![
                (interleaved, false),
                (half, false),
                (None, true),
                (interleaved, true),
            ],
        ),
        (
            (3, 48, 512, 8),
            DType::Q8_0,
            AI8,
            vec![(half, false), (half, true)],
        ),
        ((3, 48, 512, 8), DType::F16, A32, vec![(interleaved, true)]),
        ((1, 32, 256, 16), DType::F32, A32, vec![(half, true)]),
        (
            (9, 16, 2048, 8),
            DType::Q4_0,
            AQ8,
            vec![(interleaved, false), (interleaved, true)],
        ),
    ] {
        let x = r.f32(m * k, -2.0, 2.0);
        let nw = r.f32(k, -1.5, 1.5);
        let h = normed(&x, &nw, m, k, eps);
        let w = weight(&mut r, format, n, k);
        let positions = HostData::U32([7, 1000, 3, 42, 65_000, 0, 9, 12, 5][..m].to_vec());
        let inv_freq = HostData::F32(crate::ops::rope_inv_freq(10_000.0, hd));
        let heads = m * n / hd;
        let pool_rows = heads + 5;
        // Distinct slots in a scattered order, the last past the pool (writes nothing).
        let mut slots: Vec<u32> = (0..heads)
            .map(|i| ((i * 5 + 3) % pool_rows) as u32)
            .collect();
        slots[heads - 1] = pool_rows as u32 + 2;
        let pool = r.f32(pool_rows * hd, -1.0, 1.0);
        for (layout, into) in variants {
            let l = LinearSpec {
                norm: Some(PreNorm { eps }),
                rope: layout.map(|layout| RopeEpilogue {
                    head_dim: hd,
                    layout,
                }),
                ..product(format, act, m, n, k)
            };
            let mut inputs = vec![x.clone(), w.clone(), nw.clone()];
            if layout.is_some() {
                inputs.extend([positions.clone(), inv_freq.clone()]);
            }
            let spec = OpSpec::NormLinear(l);
            let scale = want_max(&spec, &inputs);
            let tol = 1e-5 * (k as f32).sqrt() + flips(act, &h, weight_max(&w), scale);
            if !into {
                c.push(FusedCase {
                    spec,
                    inputs,
                    target: None,
                    tol,
                });
                continue;
            }
            inputs.push(HostData::U32(slots.clone()));
            c.push(FusedCase {
                spec: OpSpec::NormLinearInto {
                    l,
                    head_dim: hd,
                    pool_rows,
                    paired: false,
                },
                inputs,
                target: Some(pool.clone()),
                tol,
            });
        }
    }
    // Attention: (heads, kv_heads, head_dim, t, n, extra columns, window, soft-cap).
    for (heads, kv, hd, t, n, extra, window, softcap) in [
        (4, 2, 16, 1, 1, 0, None, None),
        (4, 2, 16, 3, 29, 3, None, None),
        (4, 2, 16, 3, 29, 3, None, Some(0.3)),
        (3, 1, 16, 3, 7, 0, Some(4), None),
        (3, 1, 16, 3, 7, 0, Some(4), Some(0.3)),
        (2, 2, 72, 2, 40, 5, Some(64), None),
        (2, 1, 300, 1, 9, 0, None, None),
        (2, 1, 16, 2, 600, 7, None, None),
        (2, 1, 16, 1, 600, 0, Some(300), None),
    ] {
        let slots = n + 11;
        let pool_rows = kv * slots;
        let stride = n + extra;
        // Key j of head g at a scattered distinct slot; the extra columns past the pool.
        let rows: Vec<u32> = (0..kv)
            .flat_map(|g| {
                (0..stride).map(move |j| {
                    if j < n {
                        (g * slots + (j * 13 + 3) % slots) as u32
                    } else {
                        (pool_rows + j) as u32
                    }
                })
            })
            .collect();
        let spec = OpSpec::PagedAttention(AttentionSpec {
            t,
            n,
            stride,
            heads,
            kv_heads: kv,
            head_dim: hd,
            pool_rows,
            scale: 0.25,
            window,
            softcap,
        });
        let inputs = vec![
            r.f32(t * heads * hd, -2.0, 2.0),
            r.f32(pool_rows * hd, -1.0, 1.0),
            r.f32(pool_rows * hd, -1.0, 1.0),
            HostData::U32(rows),
        ];
        c.push(FusedCase {
            spec,
            inputs,
            target: None,
            tol: 1e-5 * (n as f32).sqrt(),
        });
    }
    c
}

#[test]
fn fused_launches_match_the_reference_on_the_emulated_kernels() {
    let Some(emu) = Emulator::open() else {
        return;
    };
    for case in fused_cases() {
        let what = format!("{:?}", case.spec);
        let storages: Vec<Storage> = case.inputs.iter().map(host).collect();
        let refs: Vec<&Storage> = storages.iter().collect();
        let bufs: Vec<EmuBuffer> = case.inputs.iter().map(EmuBuffer::from_host).collect();
        let buf_refs: Vec<&EmuBuffer> = bufs.iter().collect();
        let (got, want) = match &case.target {
            Some(target) => {
                let mut want = host(target);
                ReferenceBackend
                    .write_into(&case.spec, &mut [&mut want], &refs)
                    .expect(&what);
                let out = EmuBuffer::from_host(target);
                launch_in_place(&emu, &case.spec, &out, &buf_refs).expect(&what);
                (out.to_host(), want)
            }
            None => {
                let want = ReferenceBackend.execute(&case.spec, &refs).expect(&what);
                let out = EmuBuffer::new(case.spec.output_len(), DType::F32);
                launch(&emu, &case.spec, &out, &buf_refs).expect(&what);
                (out.to_host(), want)
            }
        };
        assert_same(&what, &got, want.as_host().expect("host data"), case.tol);
    }
}

/// A replayed step's attention reads its key count from memory ([`Arg::KeysAt`]): given an
/// address, the kernel takes the count there over the one in its arguments.
#[test]
fn attention_reads_the_key_count_from_memory_when_given_its_address() {
    use super::launch::fused::AttentionArgs;
    let Some(emu) = Emulator::open() else {
        return;
    };
    let mut r = Inputs(StdRng::seed_from_u64(31));
    let (heads, kv, hd, n, stride) = (4, 2, 16, 20, 32);
    let pool_rows = kv * stride;
    let rows: Vec<u32> = (0..kv * stride).map(|i| i as u32).collect();
    let spec = AttentionSpec {
        t: 1,
        n,
        stride,
        heads,
        kv_heads: kv,
        head_dim: hd,
        pool_rows,
        scale: 0.5,
        window: None,
        softcap: None,
    };
    let inputs = [
        r.f32(heads * hd, -2.0, 2.0),
        r.f32(pool_rows * hd, -1.0, 1.0),
        r.f32(pool_rows * hd, -1.0, 1.0),
        HostData::U32(rows),
    ];
    let storages: Vec<Storage> = inputs.iter().map(host).collect();
    let refs: Vec<&Storage> = storages.iter().collect();
    let want = ReferenceBackend
        .execute(&OpSpec::PagedAttention(spec), &refs)
        .expect("reference");
    let bufs: Vec<EmuBuffer> = inputs.iter().map(EmuBuffer::from_host).collect();
    let out = EmuBuffer::new(heads * hd, DType::F32);
    let count = EmuBuffer::from_host(&HostData::U32(vec![n as u32]));
    let args = AttentionArgs {
        out: emu.ptr(&out),
        q: emu.ptr(&bufs[0]),
        keys: emu.ptr(&bufs[1]),
        values: emu.ptr(&bufs[2]),
        rows: emu.ptr(&bufs[3]),
        // What the step was recorded with, not what this replay has.
        n: 3,
        t: 1,
        stride: stride as u32,
        heads: heads as u32,
        kv_heads: kv as u32,
        head_dim: hd as u32,
        pool_rows: pool_rows as u32,
        scale: 0.5,
        window: 0,
        softcap: 0.0,
    };
    let args: Vec<Arg> = args
        .args()
        .into_iter()
        .map(|a| match a {
            Arg::KeysAt => Arg::Ptr(emu.ptr(&count)),
            a => a,
        })
        .collect();
    emu.run("paged_attention", (heads as u32, 1, 1), &args)
        .expect("attention");
    assert_same(
        "attention with the key count in memory",
        &out.to_host(),
        want.as_host().expect("host"),
        1e-5 * (n as f32).sqrt(),
    );
}
