//! Embedding lookup.

use super::{dispatch, expect_dtype};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Gathers rows of `table` `[vocab, dim]` at `ids` (u32, any shape); the output has shape
/// `ids.shape + [dim]`.
///
/// Ids known on the host (tensors made from slices, argmax results) are checked and an id
/// `≥ vocab` is an error. An out-of-range id computed on a GPU cannot be checked without a
/// readback; its row is NaN, so the mistake shows instead of reading other memory.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let format = table.dtype();
    if format != DType::F32 && !crate::quant::is_weight_format(format) {
        return Err(Error::invalid(
            "embedding",
            format!("the table must be f32, f16, bf16 or a block format, not {format}"),
        ));
    }
    expect_dtype("embedding", "ids", ids, DType::U32)?;
    let &[vocab, dim] = table.dims() else {
        return Err(Error::shape(
            "embedding",
            "`table` must be [vocab, dim]",
            &[table.shape()],
        ));
    };
    if let Some(bound) = ids.index_bound() {
        if bound as usize > vocab {
            return Err(Error::invalid(
                "embedding",
                format!(
                    "id {} is out of range for a table of {vocab} rows",
                    bound - 1
                ),
            ));
        }
    }
    let count = ids.shape().numel();
    let mut out_dims = ids.dims().to_vec();
    out_dims.push(dim);
    let spec = OpSpec::Embedding {
        vocab,
        dim,
        count,
        format,
    };
    dispatch(
        "embedding",
        spec,
        &[table, ids],
        Shape::from(out_dims),
        DType::F32,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// A packed table gathers, on the host backends, the rows its f32 dequantization holds:
    /// Q8_0 and bf16 tables on cpu and reference, the rows picked out of order and repeated.
    #[test]
    fn a_packed_table_gathers_its_dequantized_rows() {
        let (vocab, dim) = (7, 64);
        let values: Vec<f32> = (0..vocab * dim)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0)
            .collect();
        let mut q8 = vec![0u8; vocab * DType::Q8_0.row_bytes(dim)];
        crate::quant::quantize(DType::Q8_0, &values, &mut q8);
        let bf16: Vec<u8> = values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let ids = [5u32, 0, 5, 3];
        for device in [Device::cpu(), Device::reference()] {
            for (format, bytes) in [(DType::Q8_0, q8.clone()), (DType::BF16, bf16.clone())] {
                let table = Tensor::from_bytes(&device, format, bytes, [vocab, dim]).unwrap();
                let all = crate::ops::dequantize(&table)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let id_tensor = Tensor::from_slice(&device, &ids, [ids.len()]).unwrap();
                let got = embedding(&table, &id_tensor)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let want: Vec<f32> = ids
                    .iter()
                    .flat_map(|&i| all[i as usize * dim..(i as usize + 1) * dim].to_vec())
                    .collect();
                assert_eq!(got, want, "{format} on {}", device.backend_name());
            }
        }
    }
}
