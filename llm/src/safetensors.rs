//! Reading safetensors files: an 8-byte little-endian header length, a JSON header naming each
//! tensor's dtype, shape and byte range, then the data. Every field is checked against the
//! file before use, so a truncated or lying file is an error naming the tensor, never a panic.

use std::collections::BTreeMap;

use serde_json::Value;

use super::weights::{RawTensor, StoredDType};
use webtensor::error::{Error, Result};

/// Largest header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// The header's entries in file order; a name given twice is an error (a JSON map would keep
/// the last silently, and which one the writer meant is a guess).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut entries = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, Value>()? {
                    if !seen.insert(name.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "the tensor name `{name}` appears twice"
                        )));
                    }
                    entries.push((name, value));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The tensors of one safetensors file, as byte ranges into `bytes`. As the format requires
/// (and the `safetensors` crate checks), the tensors' byte ranges cover the data section
/// exactly, without gaps or overlaps, so every byte is described by a dtype and shape.
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
    let after = bytes.len() as u64 - 8;
    if header_len > MAX_HEADER || header_len > after {
        return Err(bad(format!(
            "the header claims {header_len} bytes but the file has {after} after the length \
             (and headers are at most {MAX_HEADER}); the file is truncated or not safetensors"
        )));
    }
    let data_start = 8 + header_len as usize;
    let Entries(header) = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| bad(format!("the header is not valid safetensors JSON: {e}")))?;
    let data_len = (bytes.len() - data_start) as u64;
    let mut tensors = BTreeMap::new();
    let mut spans = Vec::new();
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
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
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
        if begin > end || end > data_len {
            return Err(bad(format!(
                "tensor `{name}` spans bytes {begin}..{end} but the data section has {data_len}; \
                 the file is truncated or its header lies"
            )));
        }
        let expected = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .and_then(|n| n.checked_mul(dtype.bytes_per_value() as u64));
        if expected != Some(end - begin) {
            return Err(bad(format!(
                "tensor `{name}` of shape {shape:?} and dtype {dtype_name} needs {} bytes, \
                 the header gives {}",
                expected.map_or("more than 2^64".into(), |e| e.to_string()),
                end - begin
            )));
        }
        spans.push((begin, end, name.clone()));
        tensors.insert(
            name,
            RawTensor {
                dtype,
                shape,
                range: data_start + begin as usize..data_start + end as usize,
            },
        );
    }
    spans.sort();
    let mut covered = 0;
    for (begin, end, name) in spans {
        if begin != covered {
            return Err(bad(format!(
                "tensor `{name}` starts at byte {begin} of the data, but the tensors before it \
                 end at {covered}: tensors overlap or leave a gap"
            )));
        }
        covered = end;
    }
    if covered != data_len {
        return Err(bad(format!(
            "the tensors cover {covered} bytes of a data section of {data_len}: bytes no \
             tensor describes"
        )));
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
