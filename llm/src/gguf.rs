//! Reading and writing GGUF files (versions 2 and 3), as llama.cpp's tools write them.
//!
//! Layout: magic `GGUF`, version, tensor count, metadata count; the metadata (typed key/value
//! pairs); the tensor infos (name, dims innermost first, ggml type, offset); padding to the
//! alignment (`general.alignment`, 32 by default); the tensor data. Every count, length and
//! offset is checked against the file, so a truncated or lying file is an error that names
//! what is wrong, never a panic or an out-of-memory.

use std::collections::BTreeMap;

use super::weights::{RawTensor, StoredDType};
use webtensor::error::{Error, Result};

mod value;

pub use value::{GgufArray, GgufItem, GgufValue};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: usize = 32;
/// Most metadata entries read. Real files have tens; each entry costs a map node, so a file of
/// millions of tiny entries would take several times its size in memory.
const MAX_METADATA: usize = 1 << 16;

/// A parsed GGUF file: metadata and tensors (byte ranges into the file).
#[derive(Clone, Debug, Default)]
pub struct Gguf {
    /// Metadata by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensors by name, shapes row-major (outermost first).
    pub tensors: BTreeMap<String, RawTensor>,
}

/// The ggml type ids webtensor reads, and their dtypes: the plain types here, the block
/// formats from their rows in [`webtensor::quant::FORMATS`].
fn stored_dtype(ggml_type: u32) -> Option<StoredDType> {
    Some(match ggml_type {
        0 => StoredDType::F32,
        1 => StoredDType::F16,
        30 => StoredDType::BF16,
        id => StoredDType::Packed(webtensor::quant::format_of_ggml(id)?.dtype),
    })
}

/// The ggml type id of a dtype webtensor writes.
fn ggml_type(dtype: StoredDType) -> Option<u32> {
    match dtype {
        StoredDType::F32 => Some(0),
        StoredDType::F16 => Some(1),
        StoredDType::BF16 => Some(30),
        StoredDType::Packed(d) => webtensor::quant::format(d)?.ggml_type,
    }
}

/// ggml's name of type id `id` (gguf-py's `GGMLQuantizationType`), for messages about types
/// webtensor does not read.
fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [(u32, &str); 35] = [
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (4, "Q4_2 (removed from ggml)"),
        (5, "Q4_3 (removed from ggml)"),
        (6, "Q5_0"),
        (7, "Q5_1"),
        (8, "Q8_0"),
        (9, "Q8_1"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (12, "Q4_K"),
        (13, "Q5_K"),
        (14, "Q6_K"),
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (17, "IQ2_XS"),
        (18, "IQ3_XXS"),
        (19, "IQ1_S"),
        (20, "IQ4_NL"),
        (21, "IQ3_S"),
        (22, "IQ2_S"),
        (23, "IQ4_XS"),
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (29, "IQ1_M"),
        (30, "BF16"),
        (34, "TQ1_0"),
        (35, "TQ2_0"),
        (39, "MXFP4"),
        (40, "NVFP4"),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == id)
        .map_or("unknown to ggml", |(_, name)| name)
}

/// The types [`stored_dtype`] reads, by ggml's names, for messages.
fn readable_types() -> String {
    (0..64)
        .filter(|&id| stored_dtype(id).is_some())
        .map(ggml_type_name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bytes of `count` values of `dtype`, or `None` when the row is not whole blocks.
fn data_bytes(dtype: StoredDType, count: usize, row: usize) -> Option<usize> {
    match dtype {
        StoredDType::Packed(d) => d.storage_len(count, row),
        other => count.checked_mul(other.bytes_per_value()),
    }
}

/// A bounds-checked reader over the file.
struct Cursor<'a> {
    path: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn fail(&self, what: &str) -> Error {
        Error::model_file(
            self.path,
            format!(
                "{what} at byte {} (file of {} bytes): truncated or corrupted GGUF",
                self.at,
                self.bytes.len()
            ),
        )
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            None => Err(self.fail(&format!("reading {n} bytes of {what}"))),
        }
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A count of items of at least `min_item` bytes each, checked against what is left.
    fn count(&mut self, min_item: usize, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(min_item as u64) > left {
            return Err(self.fail(&format!("{what} = {n} does not fit the rest of the file")));
        }
        Ok(n as usize)
    }

    /// A string, borrowed from the file.
    fn str(&mut self, what: &str) -> Result<&'a str> {
        let n = self.count(1, what)?;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map_err(|_| self.fail(&format!("{what} is not UTF-8")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        self.str(what).map(str::to_string)
    }

    /// A value of GGUF type `kind`.
    fn value(&mut self, kind: u32) -> Result<GgufValue> {
        if kind == 8 {
            return Ok(GgufValue::Str(self.string("a string")?));
        }
        if kind == 9 {
            return Ok(GgufValue::Array(self.array()?));
        }
        let width = value::scalar_width(kind)
            .ok_or_else(|| self.fail(&format!("unknown metadata type {kind}")))?;
        let at = self.at;
        let item = value::scalar(kind, self.take(width, "a metadata value")?);
        Ok(match item {
            Some(GgufItem::U64(v)) => GgufValue::U64(v),
            Some(GgufItem::I64(v)) => GgufValue::I64(v),
            Some(GgufItem::F64(v)) => GgufValue::F64(v),
            Some(GgufItem::Bool(v)) => GgufValue::Bool(v),
            _ => {
                self.at = at;
                return Err(self.fail(&format!("unknown metadata type {kind}")));
            }
        })
    }

    /// An array: element type, length, elements. Numbers keep their bytes; strings go to one
    /// buffer. Arrays of arrays are refused (llama.cpp refuses them too).
    fn array(&mut self) -> Result<GgufArray> {
        let item = self.u32("an array type")?;
        if item == 8 {
            let n = self.count(8, "a string array length")?;
            // Measure first, so both buffers are allocated once at their exact size.
            let mut probe = Cursor { ..*self };
            let mut total = 0usize;
            for _ in 0..n {
                total += probe.str("an array string")?.len();
            }
            let mut text = String::with_capacity(total);
            let mut ends = Vec::with_capacity(n);
            for _ in 0..n {
                text.push_str(self.str("an array string")?);
                ends.push(text.len());
            }
            return Ok(GgufArray::from_strings(text, ends));
        }
        let width = value::scalar_width(item).ok_or_else(|| {
            self.fail(&format!(
                "array element type {item} (an array of arrays, or unknown)"
            ))
        })?;
        let n = self.count(width, "an array length")?;
        let bytes = self.take(n * width, "array elements")?.to_vec();
        GgufArray::scalars(item, bytes).ok_or_else(|| self.fail("a malformed array"))
    }
}

/// Parses a GGUF file held in `bytes` (memory-mapped or read); `path` names it in errors.
pub fn parse(path: &str, bytes: &[u8]) -> Result<Gguf> {
    parse_prefix(path, bytes, bytes.len())
}

/// Parses the header (metadata and tensor infos) of a GGUF file of `file_len` bytes from its
/// first bytes, `prefix`: what a page needs to size a model before downloading it. The
/// tensors' ranges are checked against `file_len` and point into the whole file, not into
/// `prefix`. A prefix that ends inside the header is an error (read more of the file).
pub fn parse_header(path: &str, prefix: &[u8], file_len: usize) -> Result<Gguf> {
    parse_prefix(path, prefix, file_len)
}

fn parse_prefix(path: &str, bytes: &[u8], file_len: usize) -> Result<Gguf> {
    let mut c = Cursor { path, bytes, at: 0 };
    if c.take(4, "the magic")? != MAGIC {
        return Err(Error::model_file(path, "not a GGUF file (no GGUF magic)"));
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(Error::model_file(
            path,
            format!("GGUF version {version}; webtensor reads versions 2 and 3"),
        ));
    }
    let tensor_count = c.count(24, "the tensor count")?;
    let kv_count = c.count(12, "the metadata count")?;
    if kv_count > MAX_METADATA {
        return Err(c.fail(&format!(
            "the metadata count {kv_count} is more than webtensor reads ({MAX_METADATA})"
        )));
    }
    let mut gguf = Gguf::default();
    for _ in 0..kv_count {
        let key = c.string("a metadata key")?;
        let kind = c.u32("a metadata type")?;
        let value = c.value(kind)?;
        // Which of two values would count is a guess: llama.cpp refuses the file, so do we.
        if gguf.metadata.insert(key.clone(), value).is_some() {
            return Err(Error::model_file(
                path,
                format!("the metadata key `{key}` appears twice"),
            ));
        }
    }
    let alignment = match gguf.metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
            _ => {
                return Err(Error::model_file(
                    path,
                    format!("general.alignment = {v:?} is not a power of two up to 2^20"),
                ))
            }
        },
    };
    let mut infos = Vec::new();
    for _ in 0..tensor_count {
        let name = c.string("a tensor name")?;
        let n_dims = c.u32("a tensor's rank")? as usize;
        if n_dims == 0 || n_dims > 4 {
            return Err(Error::model_file(
                path,
                format!("tensor `{name}` has rank {n_dims}; GGUF tensors have rank 1 to 4"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = c.u64("a tensor dimension")?;
            dims.push(usize::try_from(d).unwrap_or(usize::MAX));
        }
        dims.reverse();
        let kind = c.u32("a tensor type")?;
        let offset = c.u64("a tensor offset")?;
        infos.push((name, dims, kind, offset));
    }
    let data_start = c.at.div_ceil(alignment) * alignment;
    let data_len = file_len.saturating_sub(data_start) as u64;
    // llama.cpp's rule: tensors lie in the data section in the order of their infos, each at
    // the end of the one before rounded up to the alignment. So the bytes of every tensor are
    // exactly what its type and shape say; a type that does not describe its bytes (f32 data
    // declared as Q8_0) moves every later offset, and is refused.
    let mut expected_offset = 0u64;
    for (name, shape, kind, offset) in infos {
        let bad = |reason: String| Error::model_file(path, format!("tensor `{name}` {reason}"));
        let dtype = stored_dtype(kind).ok_or_else(|| {
            bad(format!(
                "has ggml type {kind} ({}); webtensor loads {}",
                ggml_type_name(kind),
                readable_types()
            ))
        })?;
        let count = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("has dimensions {shape:?} whose product overflows")))?;
        let row = shape.last().copied().unwrap_or(1);
        let block = match dtype {
            StoredDType::Packed(d) => d.block_len(),
            _ => 1,
        };
        if !row.is_multiple_of(block) {
            return Err(bad(format!(
                "of shape {shape:?} has rows of {row} values, not whole blocks of {block} \
                 ({dtype})"
            )));
        }
        let size = data_bytes(dtype, count, row)
            .ok_or_else(|| bad(format!("of shape {shape:?} needs more bytes than exist")))?
            as u64;
        if offset != expected_offset {
            return Err(bad(format!(
                "starts at data offset {offset}, but the tensors before it end at \
                 {expected_offset}: a type or shape does not describe its bytes, or the file \
                 is corrupted"
            )));
        }
        let end = offset.checked_add(size).filter(|&e| e <= data_len);
        let Some(end) = end else {
            return Err(bad(format!(
                "of shape {shape:?} and type {dtype} needs bytes {offset}..{} of a data \
                 section of {data_len}: the file is truncated or the tensor is not what it says",
                offset.saturating_add(size)
            )));
        };
        expected_offset = end.div_ceil(alignment as u64) * alignment as u64;
        let begin = data_start + offset as usize;
        let raw = RawTensor {
            dtype,
            shape,
            range: begin..begin + size as usize,
        };
        if gguf.tensors.insert(name.clone(), raw).is_some() {
            return Err(Error::model_file(
                path,
                format!("the tensor name `{name}` appears twice"),
            ));
        }
    }
    if data_len > expected_offset {
        return Err(Error::model_file(
            path,
            format!(
                "{} bytes follow the last tensor's data: a type or shape does not describe its \
                 bytes, or the file is corrupted",
                data_len - expected_offset
            ),
        ));
    }
    Ok(gguf)
}

/// Writes a GGUF version 3 file: `metadata` and `tensors` as (name, dtype, row-major shape,
/// bytes). Used by the tests and for exporting models.
pub fn write(
    metadata: &[(String, GgufValue)],
    tensors: &[(String, StoredDType, Vec<usize>, Vec<u8>)],
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    fn value(out: &mut Vec<u8>, v: &GgufValue, string: &dyn Fn(&mut Vec<u8>, &str)) {
        match v {
            GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::Bool(b) => out.push(*b as u8),
            GgufValue::Str(s) => string(out, s),
            GgufValue::Array(items) => {
                out.extend_from_slice(&items.kind().to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                match items.scalar_bytes() {
                    Some(bytes) => out.extend_from_slice(bytes),
                    None => items
                        .iter()
                        .filter_map(GgufItem::as_str)
                        .for_each(|s| string(out, s)),
                }
            }
        }
    }
    fn kind_of(v: &GgufValue) -> u32 {
        match v {
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
            GgufValue::Bool(_) => 7,
            GgufValue::Str(_) => 8,
            GgufValue::Array(_) => 9,
        }
    }
    for (key, v) in metadata {
        string(&mut out, key);
        out.extend_from_slice(&kind_of(v).to_le_bytes());
        value(&mut out, v, &string);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let kind = ggml_type(*dtype).ok_or_else(|| {
            Error::invalid(
                "gguf::write",
                format!("`{name}`: {dtype:?} has no GGUF type"),
            )
        })?;
        string(&mut out, name);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            out.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + bytes.len() as u64).div_ceil(DEFAULT_ALIGNMENT as u64)
            * DEFAULT_ALIGNMENT as u64;
    }
    out.resize(out.len().div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT, 0);
    let data_start = out.len();
    for ((_, _, _, bytes), off) in tensors.iter().zip(offsets) {
        out.resize(data_start + off as usize, 0);
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use webtensor::dtype::DType;

    fn sample() -> Vec<u8> {
        let meta = vec![
            (
                "general.architecture".to_string(),
                GgufValue::Str("llama".into()),
            ),
            ("llama.block_count".to_string(), GgufValue::U64(2)),
            (
                "tokenizer.ggml.tokens".to_string(),
                GgufValue::Array(GgufArray::strings(["a", "b"])),
            ),
        ];
        let tensors = vec![
            ("w".to_string(), StoredDType::F32, vec![2, 3], vec![1u8; 24]),
            (
                "q".to_string(),
                StoredDType::Packed(DType::Q8_0),
                vec![1, 32],
                vec![2u8; 34],
            ),
        ];
        write(&meta, &tensors).unwrap()
    }

    #[test]
    fn round_trips() {
        let bytes = sample();
        let g = parse("t.gguf", &bytes).unwrap();
        assert_eq!(g.metadata["llama.block_count"].as_u64(), Some(2));
        assert_eq!(g.tensors["w"].shape, vec![2, 3]);
        assert_eq!(&bytes[g.tensors["q"].range.clone()], &[2u8; 34][..]);
    }

    #[test]
    fn the_header_alone_gives_every_tensor_of_the_whole_file() {
        let bytes = sample();
        let whole = parse("t.gguf", &bytes).unwrap();
        let data_start = whole.tensors["w"].range.start;
        let header = parse_header("t.gguf", &bytes[..data_start], bytes.len()).unwrap();
        assert_eq!(header.tensors.len(), 2);
        for (name, t) in &whole.tensors {
            assert_eq!(header.tensors[name].range, t.range, "{name}");
            assert_eq!(header.tensors[name].shape, t.shape, "{name}");
        }
        // A prefix that ends inside the tensor infos, or a file shorter than its tensors.
        assert!(parse_header("t.gguf", &bytes[..data_start - 9], bytes.len()).is_err());
        assert!(parse_header("t.gguf", &bytes[..data_start], bytes.len() - 1).is_err());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample();
        for cut in 0..bytes.len() {
            assert!(parse("t.gguf", &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn lying_counts_and_types_are_errors() {
        let mut bytes = sample();
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse("t.gguf", &bytes)
            .unwrap_err()
            .to_string()
            .contains("tensor count"));
        let mut bytes = sample();
        bytes[4] = 9;
        assert!(parse("t.gguf", &bytes)
            .unwrap_err()
            .to_string()
            .contains("version"));
    }

    /// A file of one `[1, 256]` tensor `k` of `dtype`, and where its ggml type id lies.
    fn one_tensor(dtype: DType) -> (Vec<u8>, usize) {
        let tensor = vec![(
            "k".to_string(),
            StoredDType::Packed(dtype),
            vec![1, 256],
            vec![0u8; dtype.row_bytes(256)],
        )];
        let bytes = write(&[], &tensor).unwrap();
        // The info: name (u64 length, "k"), 2 dims as u32, the dims innermost first, the type.
        let mut info = 1u64.to_le_bytes().to_vec();
        info.extend_from_slice(b"k");
        info.extend_from_slice(&2u32.to_le_bytes());
        info.extend_from_slice(&256u64.to_le_bytes());
        info.extend_from_slice(&1u64.to_le_bytes());
        let at = bytes.windows(info.len()).position(|w| w == info).unwrap() + info.len();
        (bytes, at)
    }

    /// The llama.cpp formats are read with ggml's ids (Q4_K is 12, Q6_K 14, IQ4_XS 23, ...),
    /// and a type webtensor does not read is named in the error.
    #[test]
    fn block_formats_by_ggml_id() {
        for (dtype, id) in [
            (DType::Q4_1, 3u32),
            (DType::Q5_0, 6),
            (DType::Q5_1, 7),
            (DType::Q2_K, 10),
            (DType::Q3_K, 11),
            (DType::Q4_K, 12),
            (DType::Q5_K, 13),
            (DType::Q6_K, 14),
            (DType::IQ4_NL, 20),
            (DType::IQ4_XS, 23),
        ] {
            let (bytes, at) = one_tensor(dtype);
            assert_eq!(bytes[at..at + 4], id.to_le_bytes(), "{dtype}");
            let g = parse("t.gguf", &bytes).unwrap();
            assert_eq!(g.tensors["k"].dtype, StoredDType::Packed(dtype));
            assert_eq!(
                g.tensors["k"].range.len(),
                dtype.block_bytes() * 256 / dtype.block_len()
            );
        }
        let (mut bytes, at) = one_tensor(DType::Q4_K);
        bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
        let e = parse("t.gguf", &bytes).unwrap_err().to_string();
        assert!(e.contains("ggml type 16 (IQ2_XXS)"), "{e}");
        assert!(e.contains("Q4_K, Q5_K, Q6_K"), "{e}");
        bytes[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
        let e = parse("t.gguf", &bytes).unwrap_err().to_string();
        assert!(e.contains("ggml type 77 (unknown to ggml)"), "{e}");
    }

    /// A K-quant row must be whole super-blocks of 256 values.
    #[test]
    fn k_quant_rows_are_whole_super_blocks() {
        let tensor = vec![(
            "k".to_string(),
            StoredDType::Packed(DType::Q6_K),
            vec![2, 128],
            vec![0u8; 210],
        )];
        let bytes = write(&[], &tensor).unwrap();
        let e = parse("t.gguf", &bytes).unwrap_err().to_string();
        assert!(
            e.contains("rows of 128 values, not whole blocks of 256"),
            "{e}"
        );
    }
}
