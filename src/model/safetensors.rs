//! Reading safetensors files: an 8-byte little-endian header length, a JSON header naming each
//! tensor's dtype, shape and byte range, then the data. Every field is checked against the
//! file before use, so a truncated or lying file is an error naming the tensor, never a panic.

use std::collections::BTreeMap;

use serde_json::Value;

use super::weights::{RawTensor, StoredDType};
use crate::error::{Error, Result};

/// Largest header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// The tensors of one safetensors file, as byte ranges into `bytes`.
pub fn parse(path: &str, bytes: &[u8]) -> Result<BTreeMap<String, RawTensor>> {
    let bad = |reason: String| Error::model_file(path, reason);
    let header_len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
        .ok_or_else(|| {
            bad(format!(
                "{} bytes is too short for a safetensors header",
                bytes.len()
            ))
        })?;
    if header_len > MAX_HEADER || header_len > bytes.len() as u64 - 8 {
        return Err(bad(format!(
            "the header claims {header_len} bytes but the file has {} after the length; \
             the file is truncated or not safetensors",
            bytes.len() - 8
        )));
    }
    let data_start = 8 + header_len as usize;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| bad(format!("the header is not valid JSON: {e}")))?;
    let data_len = bytes.len() - data_start;
    let mut tensors = BTreeMap::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let field = |key: &str| {
            info.get(key)
                .ok_or_else(|| bad(format!("tensor `{name}` has no `{key}`")))
        };
        let dtype_name = field("dtype")?
            .as_str()
            .ok_or_else(|| bad(format!("tensor `{name}`: `dtype` is not a string")))?;
        let dtype = match dtype_name {
            "F32" => StoredDType::F32,
            "F16" => StoredDType::F16,
            "BF16" => StoredDType::BF16,
            other => {
                return Err(bad(format!(
                    "tensor `{name}` has dtype {other}; webtensor loads F32, F16 and BF16"
                )))
            }
        };
        let shape = field("shape")?
            .as_array()
            .and_then(|dims| {
                dims.iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| bad(format!("tensor `{name}`: `shape` is not a list of sizes")))?;
        let offsets = field("data_offsets")?
            .as_array()
            .and_then(|o| match o.as_slice() {
                [a, b] => Some((a.as_u64()?, b.as_u64()?)),
                _ => None,
            })
            .ok_or_else(|| {
                bad(format!(
                    "tensor `{name}`: `data_offsets` is not [begin, end]"
                ))
            })?;
        let (begin, end) = offsets;
        if begin > end || end > data_len as u64 {
            return Err(bad(format!(
                "tensor `{name}` spans bytes {begin}..{end} but the data section has {data_len}; \
                 the file is truncated or its header lies"
            )));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad(format!("tensor `{name}`: shape {shape:?} overflows")))?;
        let expected = numel as u64 * dtype.bytes_per_value() as u64;
        if end - begin != expected {
            return Err(bad(format!(
                "tensor `{name}` of shape {shape:?} and dtype {dtype_name} needs {expected} bytes, \
                 the header gives {}",
                end - begin
            )));
        }
        tensors.insert(
            name,
            RawTensor {
                dtype,
                shape,
                range: data_start + begin as usize..data_start + end as usize,
            },
        );
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn reads_tensors_and_rejects_lies() {
        let ok = file(
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let t = parse("m", &ok).unwrap();
        assert_eq!(t["w"].shape, vec![2]);
        let truncated = &ok[..ok.len() - 1];
        assert!(parse("m", truncated)
            .unwrap_err()
            .to_string()
            .contains("`w`"));
        let wrong_size = file(
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        assert!(parse("m", &wrong_size)
            .unwrap_err()
            .to_string()
            .contains("needs 12 bytes"));
        let bad_dtype = file(
            r#"{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        assert!(parse("m", &bad_dtype).is_err());
        assert!(parse("m", &[1, 2, 3]).is_err());
        let huge = file(r#"{}"#, &[]);
        let mut lying = huge.clone();
        lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse("m", &lying).is_err());
    }
}
