//! Reading and writing GGUF files (versions 2 and 3), as llama.cpp's tools write them.
//!
//! Layout: magic `GGUF`, version, tensor count, metadata count; the metadata (typed key/value
//! pairs); the tensor infos (name, dims innermost first, ggml type, offset); padding to the
//! alignment (`general.alignment`, 32 by default); the tensor data. Every count, length and
//! offset is checked against the file, so a truncated or lying file is an error that names
//! what is wrong, never a panic or an out-of-memory.

use std::collections::BTreeMap;

use super::weights::{RawTensor, StoredDType};
use crate::error::{Error, Result};
use crate::tensor::DType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: usize = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// A parsed GGUF file: metadata and tensors (byte ranges into the file).
#[derive(Clone, Debug, Default)]
pub struct Gguf {
    /// Metadata by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensors by name, shapes row-major (outermost first).
    pub tensors: BTreeMap<String, RawTensor>,
}

/// The ggml type ids webtensor reads, and their dtypes.
fn stored_dtype(ggml_type: u32) -> Option<StoredDType> {
    Some(match ggml_type {
        0 => StoredDType::F32,
        1 => StoredDType::F16,
        2 => StoredDType::Packed(DType::Q4_0),
        8 => StoredDType::Packed(DType::Q8_0),
        30 => StoredDType::BF16,
        34 => StoredDType::Packed(DType::TQ1_0),
        35 => StoredDType::Packed(DType::TQ2_0),
        _ => return None,
    })
}

/// The ggml type id of a dtype webtensor writes.
fn ggml_type(dtype: StoredDType) -> Option<u32> {
    Some(match dtype {
        StoredDType::F32 => 0,
        StoredDType::F16 => 1,
        StoredDType::BF16 => 30,
        StoredDType::Packed(DType::Q4_0) => 2,
        StoredDType::Packed(DType::Q8_0) => 8,
        StoredDType::Packed(DType::TQ1_0) => 34,
        StoredDType::Packed(DType::TQ2_0) => 35,
        StoredDType::Packed(_) => return None,
    })
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

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(1, what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.fail(&format!("{what} is not UTF-8")))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<GgufValue> {
        Ok(match kind {
            0 => GgufValue::U64(self.take(1, "a u8")?[0] as u64),
            1 => GgufValue::I64(self.take(1, "an i8")?[0] as i8 as i64),
            2 => {
                let b = self.take(2, "a u16")?;
                GgufValue::U64(u16::from_le_bytes([b[0], b[1]]) as u64)
            }
            3 => {
                let b = self.take(2, "an i16")?;
                GgufValue::I64(i16::from_le_bytes([b[0], b[1]]) as i64)
            }
            4 => GgufValue::U64(self.u32("a u32")? as u64),
            5 => GgufValue::I64(self.u32("an i32")? as i32 as i64),
            6 => GgufValue::F64(f32::from_bits(self.u32("an f32")?) as f64),
            7 => GgufValue::Bool(self.take(1, "a bool")?[0] != 0),
            8 => GgufValue::Str(self.string("a string")?),
            9 => {
                if depth > 2 {
                    return Err(self.fail("arrays nested too deeply"));
                }
                let item = self.u32("an array type")?;
                let n = self.count(1, "an array length")?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(item, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64("a u64")?),
            11 => GgufValue::I64(self.u64("an i64")? as i64),
            12 => GgufValue::F64(f64::from_bits(self.u64("an f64")?)),
            other => return Err(self.fail(&format!("unknown metadata type {other}"))),
        })
    }
}

/// Parses a GGUF file held in `bytes` (memory-mapped or read); `path` names it in errors.
pub fn parse(path: &str, bytes: &[u8]) -> Result<Gguf> {
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
    let mut gguf = Gguf::default();
    for _ in 0..kv_count {
        let key = c.string("a metadata key")?;
        let kind = c.u32("a metadata type")?;
        let value = c.value(kind, 0)?;
        gguf.metadata.insert(key, value);
    }
    let alignment = match gguf.metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
            _ => {
                return Err(Error::model_file(
                    path,
                    format!("general.alignment = {v:?} is not a power of two"),
                ))
            }
        },
    };
    let mut infos = Vec::with_capacity(tensor_count);
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
            dims.push(c.u64("a tensor dimension")? as usize);
        }
        dims.reverse();
        let kind = c.u32("a tensor type")?;
        let offset = c.u64("a tensor offset")?;
        infos.push((name, dims, kind, offset));
    }
    let data_start = c.at.div_ceil(alignment) * alignment;
    let data_len = bytes.len().saturating_sub(data_start);
    for (name, shape, kind, offset) in infos {
        let bad = |reason: String| Error::model_file(path, format!("tensor `{name}` {reason}"));
        let dtype = stored_dtype(kind).ok_or_else(|| {
            bad(format!(
                "has ggml type {kind}; webtensor loads F32, F16, BF16, Q8_0, Q4_0, TQ1_0, TQ2_0"
            ))
        })?;
        let count = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("has dimensions {shape:?} that overflow")))?;
        let row = shape.last().copied().unwrap_or(1);
        let size = data_bytes(dtype, count, row)
            .ok_or_else(|| bad(format!("has rows of {row} values, not whole blocks")))?;
        if offset % alignment as u64 != 0 {
            return Err(bad(format!(
                "starts at offset {offset}, not a multiple of {alignment}"
            )));
        }
        let end = offset.checked_add(size as u64);
        if end.is_none_or(|e| e > data_len as u64) {
            return Err(bad(format!(
                "needs bytes {offset}..{} of a data section of {data_len}: the file is truncated \
                 or the offset is wrong",
                offset.saturating_add(size as u64)
            )));
        }
        let begin = data_start + offset as usize;
        gguf.tensors.insert(
            name,
            RawTensor {
                dtype,
                shape,
                range: begin..begin + size,
            },
        );
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
                let kind = items.first().map_or(10, kind_of);
                out.extend_from_slice(&kind.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    value(out, item, string);
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

    fn sample() -> Vec<u8> {
        let meta = vec![
            (
                "general.architecture".to_string(),
                GgufValue::Str("llama".into()),
            ),
            ("llama.block_count".to_string(), GgufValue::U64(2)),
            (
                "tokenizer.ggml.tokens".to_string(),
                GgufValue::Array(vec![GgufValue::Str("a".into()), GgufValue::Str("b".into())]),
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
}
