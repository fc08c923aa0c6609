//! In-place row writes: the KV cache's way of storing new keys and values without copying
//! the cache.

use super::layout::expect_words;
use super::{dispatch_in_place, expect_dtype, expect_min_rank};
use crate::backend::OpSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Writes row `i` of `src` over row `slots[i]` of `dst`, in place. `dst` is `[rows, ...]`,
/// `src` is `[count, ...]` with the same trailing dimensions and dtype (f32 or u32), `slots`
/// is u32 `[count]` with distinct values below `rows`.
///
/// Slots known on the host are checked, and one `≥ rows` is an error; a slot computed on a
/// GPU that is out of range writes nothing. With repeated slots, which row lands is
/// unspecified. Nothing is copied but the written rows, unless another tensor (a clone or a
/// reshape of `dst`) shares `dst`'s memory: then `dst` is copied first, so the write never
/// shows through another tensor.
pub fn scatter_rows(dst: &mut Tensor, slots: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "scatter_rows";
    expect_words(OP, "dst", dst)?;
    expect_dtype(OP, "src", src, dst.dtype())?;
    expect_dtype(OP, "slots", slots, DType::U32)?;
    expect_min_rank(OP, dst, 1)?;
    expect_min_rank(OP, src, 1)?;
    let count = src.dims()[0];
    if dst.dims()[1..] != src.dims()[1..] || slots.dims() != [count] {
        return Err(Error::shape(
            OP,
            "needs dst [rows, ...], src [count, ...] with the same trailing dimensions, and \
             slots [count]",
            &[dst.shape(), src.shape(), slots.shape()],
        ));
    }
    let rows = dst.dims()[0];
    if let Some(bound) = slots.index_bound() {
        if bound as usize > rows {
            return Err(Error::invalid(
                OP,
                format!("slot {} is out of range for {rows} rows", bound - 1),
            ));
        }
    }
    let cols: usize = dst.dims()[1..].iter().product();
    if count == 0 || cols == 0 {
        return Ok(());
    }
    let spec = OpSpec::ScatterRows { rows, cols, count };
    dispatch_in_place(OP, spec, &mut [dst], &[src, slots])
}
