//! The launch code's argument lists checked against the kernels' parameter lists.
//!
//! A kernel's arguments go to the driver as a positional list of untyped addresses
//! (`launch/*.rs` builds it as `Vec<Arg>`), so an argument dropped, added or swapped with
//! one of another type is not a compile error: the kernel reads garbage, on a GPU that CI
//! does not have. Here a [`Recorder`] stands in for the device and logs every launch the
//! backend's own launch code makes for the ops of the emulation tests (`emulated.rs`:
//! every op at awkward shapes, every fused variant), running no kernel, so it needs neither a
//! CUDA device nor a toolkit nor the emulation's build; each logged launch is compared, kind
//! by kind, with the parameters the kernel declares in `kernels/*.cu`, parsed from the
//! sources the backend compiles ([`SOURCES`]). Every entry point must be launched by some
//! case, so a kernel no case reaches fails too.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};

use super::emulated::{cases, fused_cases};
use super::launcher::{launch, launch_in_place, Arg, Launcher};
use super::sources::SOURCES;
use crate::backend::{HostData, OpSpec};
use crate::dtype::DType;
use crate::error::Result;

/// A kernel parameter's type, as far as the launch must match it.
#[derive(Clone, Debug, PartialEq)]
enum Param {
    /// A pointer, with its pointee type (qualifiers dropped), e.g. `float`, `u32`.
    Ptr(String),
    U32,
    U64,
    F32,
}

/// One `extern "C" __global__` kernel of a source file.
#[derive(Debug)]
struct Kernel {
    /// The source file, for messages.
    file: &'static str,
    /// Each parameter's type and its declaration as written (`const float* x`).
    params: Vec<(Param, String)>,
}

/// The scalar types the sources use (the typedefs of `kernels/common.cu` and their
/// spellings), or `None` for one no [`Arg`] carries.
fn scalar(ty: &str) -> Option<Param> {
    match ty {
        "u32" | "unsigned" | "unsigned int" | "uint32_t" => Some(Param::U32),
        "u64" | "unsigned long long" | "unsigned long long int" | "uint64_t" => Some(Param::U64),
        "float" => Some(Param::F32),
        _ => None,
    }
}

/// Parses one parameter declaration (`const float* __restrict__ x`, `u32 n`) of `kernel`.
fn parse_param(kernel: &str, at: usize, decl: &str) -> std::result::Result<Param, String> {
    let spaced = decl.replace('*', " * ");
    let mut words: Vec<&str> = spaced
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__restrict__"))
        .collect();
    let named = words
        .last()
        .is_some_and(|w| w.chars().all(|c| c.is_alphanumeric() || c == '_'));
    if words.len() < 2 || !named {
        return Err(format!(
            "{kernel}: parameter {at} `{decl}` is not `TYPE NAME`"
        ));
    }
    words.pop();
    let stars = words.iter().filter(|w| **w == "*").count();
    let ty = words
        .iter()
        .filter(|w| **w != "*")
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    match stars {
        0 => scalar(&ty).ok_or_else(|| {
            format!("{kernel}: parameter {at} `{decl}` has type `{ty}`, which no Arg passes")
        }),
        _ => Ok(Param::Ptr(ty)),
    }
}

/// Every `extern "C" __global__ void NAME(PARAMS)` of `body` (comments removed first).
fn parse_kernels(
    file: &'static str,
    body: &str,
) -> std::result::Result<BTreeMap<String, Kernel>, String> {
    let mut text = String::with_capacity(body.len());
    for line in body.lines() {
        text.push_str(line.split("//").next().unwrap_or(""));
        text.push('\n');
    }
    while let Some(open) = text.find("/*") {
        let close = text[open..]
            .find("*/")
            .ok_or_else(|| format!("{file}: an unclosed comment"))?;
        text.replace_range(open..open + close + 2, " ");
    }
    let mut out = BTreeMap::new();
    for (at, _) in text.match_indices("__global__") {
        let rest = text[at + "__global__".len()..].trim_start();
        let head = rest
            .strip_prefix("void")
            .filter(|r| r.starts_with(char::is_whitespace))
            .ok_or_else(|| format!("{file}: a __global__ function not written `void NAME(`"))?;
        let (name, rest) = head
            .split_once('(')
            .ok_or_else(|| format!("{file}: a __global__ function without a parameter list"))?;
        let name = name.trim();
        let list = &rest[..rest
            .find(')')
            .ok_or_else(|| format!("{file}: {name}: an unclosed parameter list"))?];
        let params = match list.trim() {
            "" | "void" => Vec::new(),
            list => list
                .split(',')
                .enumerate()
                .map(|(i, decl)| Ok((parse_param(name, i, decl)?, decl.trim().to_string())))
                .collect::<std::result::Result<_, String>>()?,
        };
        out.insert(name.to_string(), Kernel { file, params });
    }
    Ok(out)
}

/// Every kernel of every source the backend compiles, by name.
fn all_kernels() -> std::result::Result<BTreeMap<String, Kernel>, String> {
    let mut all = BTreeMap::new();
    for s in SOURCES {
        for (name, kernel) in parse_kernels(s.name, s.body)? {
            if let Some(other) = all.insert(name.clone(), kernel) {
                return Err(format!(
                    "{name} is defined in {} and {}",
                    other.file, s.name
                ));
            }
        }
    }
    Ok(all)
}

/// An argument's kind as the launch code wrote it.
fn kind(a: &Arg) -> &'static str {
    match a {
        Arg::Ptr(_) => "Arg::Ptr",
        Arg::U32(_) => "Arg::U32",
        Arg::U64(_) => "Arg::U64",
        Arg::F32(_) => "Arg::F32",
        Arg::KeysAt => "Arg::KeysAt",
    }
}

/// Whether argument `a` is what a parameter of type `p` takes: any pointer for an address,
/// a `u32` pointer for [`Arg::KeysAt`] (the key count's address), each scalar its own type.
fn fits(a: &Arg, p: &Param) -> bool {
    match (a, p) {
        (Arg::Ptr(_), Param::Ptr(_)) => true,
        (Arg::KeysAt, Param::Ptr(pointee)) => scalar(pointee) == Some(Param::U32),
        (Arg::U32(_), Param::U32) | (Arg::U64(_), Param::U64) | (Arg::F32(_), Param::F32) => true,
        _ => false,
    }
}

/// Checks a launch of kernel `name` with `args` (made for op `by`) against the kernels;
/// the error names the kernel, its file, the position and both types.
fn check_launch(
    kernels: &BTreeMap<String, Kernel>,
    name: &str,
    args: &[Arg],
    by: &str,
) -> std::result::Result<(), String> {
    let kernel = kernels
        .get(name)
        .ok_or_else(|| format!("{by} launches {name}, which no kernels/*.cu defines"))?;
    let declared = || {
        let list: Vec<&str> = kernel.params.iter().map(|(_, d)| d.as_str()).collect();
        list.join(", ")
    };
    if args.len() != kernel.params.len() {
        let passed: Vec<&str> = args.iter().map(kind).collect();
        return Err(format!(
            "{by} launches {name} with {} arguments ({}), but {} declares {} parameters ({})",
            args.len(),
            passed.join(", "),
            kernel.file,
            kernel.params.len(),
            declared()
        ));
    }
    match args
        .iter()
        .zip(&kernel.params)
        .position(|(a, (p, _))| !fits(a, p))
    {
        Some(i) => Err(format!(
            "{by} launches {name} with {} at position {i}, but parameter {i} in {} is `{}` \
             (declared: {})",
            kind(&args[i]),
            kernel.file,
            kernel.params[i].1,
            declared()
        )),
        None => Ok(()),
    }
}

/// A stand-in for device memory: only its type, length and a distinct address.
struct Slot {
    dtype: DType,
    len: usize,
    address: u64,
}

/// A [`Launcher`] that runs nothing and logs each launch: the op being launched, the
/// kernel's name and its arguments.
#[derive(Default)]
struct Recorder {
    next: Cell<u64>,
    op: RefCell<String>,
    log: RefCell<Vec<(String, &'static str, Vec<Arg>)>>,
}

impl Recorder {
    fn slot(&self, len: usize, dtype: DType) -> Slot {
        let address = (self.next.get() + 1) << 32;
        self.next.set(self.next.get() + 1);
        Slot {
            dtype,
            len,
            address,
        }
    }

    /// Runs the launch code of `spec` on `inputs`, in place into `target` where given.
    fn drive(&self, spec: &OpSpec, inputs: &[HostData], target: Option<&HostData>) {
        let what = format!("{spec:?}");
        self.op.replace(what.clone());
        let slots: Vec<Slot> = inputs
            .iter()
            .map(|h| self.slot(h.len(), h.dtype()))
            .collect();
        let refs: Vec<&Slot> = slots.iter().collect();
        match target {
            Some(t) => launch_in_place(self, spec, &self.slot(t.len(), t.dtype()), &refs),
            None => {
                let dtype = spec.output_dtype(inputs[0].dtype());
                launch(self, spec, &self.slot(spec.output_len(), dtype), &refs)
            }
        }
        .expect(&what);
    }
}

impl Launcher for Recorder {
    type Buffer = Slot;

    fn ptr(&self, b: &Slot) -> u64 {
        b.address
    }

    fn dtype(&self, b: &Slot) -> DType {
        b.dtype
    }

    fn len(&self, b: &Slot) -> usize {
        b.len
    }

    fn scratch(&self, _op: &'static str, len: usize, dtype: DType) -> Result<Slot> {
        Ok(self.slot(len, dtype))
    }

    fn run(&self, name: &'static str, _grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        let op = self.op.borrow().clone();
        self.log.borrow_mut().push((op, name, args.to_vec()));
        Ok(())
    }

    fn write_bytes(&self, _dst: u64, _data: &[u8]) -> Result<()> {
        Ok(())
    }

    fn copy_bytes(&self, _src: u64, _dst: u64, _bytes: usize) -> Result<()> {
        Ok(())
    }
}

/// Every launch of the emulation tests' ops (and of `scatter_rows`, run in place there
/// too) fits its kernel's parameters, and every entry point is launched.
#[test]
fn every_launch_matches_its_kernels_parameters() {
    let kernels = all_kernels().unwrap_or_else(|e| panic!("parsing kernels/*.cu: {e}"));
    let rec = Recorder::default();
    for (spec, inputs) in cases() {
        rec.drive(&spec, &inputs, None);
    }
    for case in fused_cases() {
        rec.drive(&case.spec, &case.inputs, case.target.as_ref());
    }
    let scatter = OpSpec::ScatterRows {
        rows: 5,
        cols: 3,
        count: 3,
    };
    let target = HostData::F32(vec![0.0; 15]);
    let inputs = [HostData::F32(vec![0.0; 9]), HostData::U32(vec![4, 7, 1])];
    rec.drive(&scatter, &inputs, Some(&target));

    let log = rec.log.into_inner();
    // One message per kernel and argument kinds, from the first op to launch them.
    let mut failures = BTreeMap::new();
    for (op, name, args) in &log {
        let kinds: Vec<&str> = args.iter().map(kind).collect();
        if failures.contains_key(&(*name, kinds.clone())) {
            continue;
        }
        if let Err(e) = check_launch(&kernels, name, args, op) {
            failures.insert((*name, kinds), e);
        }
    }
    let failures: Vec<String> = failures.into_values().collect();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    let launched: BTreeSet<&str> = log.iter().map(|(_, name, _)| *name).collect();
    let missing: Vec<&str> = SOURCES
        .iter()
        .flat_map(|s| s.entry_points.iter().copied())
        .filter(|e| !launched.contains(e))
        .collect();
    assert!(
        missing.is_empty(),
        "no case launches {missing:?}: add one to emulated.rs so its arguments are checked"
    );
    println!(
        "{} launches of {} kernels checked against kernels/*.cu",
        log.len(),
        launched.len()
    );
}

/// The check fails, saying where, on an argument swapped, dropped or of the wrong pointee,
/// on an unknown kernel and on a parameter type no argument passes.
#[test]
fn mismatches_are_reported_with_kernel_position_and_types() {
    let kernels = parse_kernels(
        "k.cu",
        "// a comment with __global__ in it\n\
         extern \"C\" __global__ void k(float* out, const u32* /* count */ n_at,\n\
         u32 n, float scale) {}\n",
    )
    .expect("parses");
    let good = [Arg::Ptr(1), Arg::KeysAt, Arg::U32(2), Arg::F32(0.5)];
    assert_eq!(check_launch(&kernels, "k", &good, "op"), Ok(()));

    let swapped = [Arg::Ptr(1), Arg::KeysAt, Arg::F32(0.5), Arg::U32(2)];
    let e = check_launch(&kernels, "k", &swapped, "op").unwrap_err();
    assert!(
        e.contains("k with Arg::F32 at position 2") && e.contains("k.cu is `u32 n`"),
        "{e}"
    );
    let dropped = [Arg::Ptr(1), Arg::KeysAt, Arg::U32(2)];
    let e = check_launch(&kernels, "k", &dropped, "op").unwrap_err();
    assert!(
        e.contains("with 3 arguments") && e.contains("declares 4 parameters"),
        "{e}"
    );
    let count_as_ptr = [Arg::Ptr(1), Arg::Ptr(3), Arg::U32(2), Arg::F32(0.5)];
    assert_eq!(check_launch(&kernels, "k", &count_as_ptr, "op"), Ok(()));
    let keys_at_floats = [Arg::KeysAt, Arg::KeysAt, Arg::U32(2), Arg::F32(0.5)];
    let e = check_launch(&kernels, "k", &keys_at_floats, "op").unwrap_err();
    assert!(e.contains("Arg::KeysAt at position 0"), "{e}");
    let e = check_launch(&kernels, "gone", &good, "op").unwrap_err();
    assert!(e.contains("no kernels/*.cu defines"), "{e}");

    let e = parse_kernels("k.cu", "extern \"C\" __global__ void k(int n) {}").unwrap_err();
    assert!(e.contains("k: parameter 0 `int n` has type `int`"), "{e}");
}

/// The launch code refuses with a typed error, launching nothing, what the kernels do not do:
/// quantizing to a format the `quantize` kernel does not write (it would write another
/// format's blocks; it writes every format webtensor quantizes to), and `Q8_K` activations
/// over rows that are not whole 256-value blocks, in the plain and the fused products.
#[test]
fn launches_the_kernels_cannot_run_are_refused_before_any_kernel() {
    use crate::backend::{Activations, LinearSpec};
    use crate::error::Error;
    let rec = Recorder::default();
    let refused = |spec: OpSpec, inputs: &[(usize, DType)]| {
        let slots: Vec<Slot> = inputs.iter().map(|&(n, d)| rec.slot(n, d)).collect();
        let refs: Vec<&Slot> = slots.iter().collect();
        let out = rec.slot(spec.output_len(), DType::F32);
        match launch(&rec, &spec, &out, &refs) {
            Err(Error::InvalidArgument { reason, .. }) => reason,
            other => panic!("{spec:?}: {other:?}"),
        }
    };
    // The kernel writes exactly the formats webtensor has a quantizer for.
    let quantizers: Vec<DType> = crate::backend::kernel_consts::PACKED_FORMATS
        .iter()
        .map(|f| f.dtype)
        .filter(|&f| crate::quant::can_quantize(f))
        .collect();
    for format in &quantizers {
        assert!(super::launch::quant::QUANTIZES.contains(format), "{format}");
    }
    for format in [DType::Q4_K, DType::IQ4_NL] {
        let len = format.block_len();
        let spec = OpSpec::Quantize {
            format,
            rows: 1,
            cols: len,
        };
        let reason = refused(spec, &[(len, DType::F32)]);
        assert!(reason.contains(&format!("not {format}")), "{reason}");
    }
    let (m, n, k) = (1, 2, 96);
    let weight = (n * k / 32 * DType::Q4_0.block_bytes(), DType::Q4_0);
    let spec = OpSpec::QMatmul {
        format: DType::Q4_0,
        activations: Activations::Q8_K,
        m,
        n,
        k,
    };
    let reason = refused(spec, &[(m * k, DType::F32), weight]);
    assert!(reason.contains("q8_k"), "{reason}");
    let spec = OpSpec::LinearResidual(LinearSpec {
        format: DType::Q4_0,
        activations: Activations::Q8_K,
        m,
        n,
        k,
        norm: None,
        rope: None,
    });
    let reason = refused(spec, &[(m * k, DType::F32), weight, (m * n, DType::F32)]);
    assert!(reason.contains("q8_k"), "{reason}");
    assert!(rec.log.borrow().is_empty(), "{:?}", rec.log.borrow());
}
