//! Encoding `shaders/sample.wgsl`: token sampling. A greedy op (temperature 0) is two
//! dispatches spread over the rows' chunks (`greedy_chunks`, then `greedy_pick`); any other is
//! one workgroup per row (`sample`).

use super::{u32_of, Encoder, Shader};
use crate::backend::webgpu::params::SampleParams;
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

/// Logits per chunk of a greedy row, one workgroup each, and threads per workgroup
/// (`GREEDY_CHUNK` and `GREEDY_WG` of the shader).
const GREEDY_CHUNK: usize = 2048;
const GREEDY_WG: usize = 64;

/// Chunks per row of a greedy op over `vocab` logits (at least one).
fn greedy_chunks(vocab: usize) -> usize {
    vocab.div_ceil(GREEDY_CHUNK).max(1)
}

/// Words of the (key, index) pairs a greedy op writes: one per thread of each chunk of each
/// row.
fn greedy_words(rows: usize, vocab: usize) -> usize {
    2 * GREEDY_WG * rows * greedy_chunks(vocab)
}

/// Words of the temporary buffer a sample op's kernels need: [`greedy_words`] for a greedy
/// op, none for another.
pub(crate) fn sample_temp_words(rows: usize, vocab: usize, greedy: bool) -> Option<usize> {
    greedy.then(|| greedy_words(rows, vocab))
}

impl Encoder<'_> {
    /// Records one op of this family reading `raw` (the logits, the uniform draws, and for a
    /// greedy op the chunks' temporary buffer) and writing `out`.
    pub(super) fn sample(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        raw: &[&wgpu::Buffer],
    ) -> Result<()> {
        let op = spec.kind().name();
        match spec {
            OpSpec::Sample {
                rows,
                vocab,
                params,
            } => {
                let chunks = greedy_chunks(*vocab);
                let p = SampleParams {
                    rows: u32_of(op, "rows", *rows)?,
                    vocab: u32_of(op, "vocab", *vocab)?,
                    temperature: params.temperature,
                    top_k: params.top_k,
                    top_p: params.top_p,
                    chunks: u32_of(op, "chunks", chunks)?,
                    ..Default::default()
                };
                u32_of(op, "rows·vocab", rows * vocab)?;
                let grid = self.grid(op, *rows as u64)?;
                if !params.is_greedy() {
                    return self.run(Shader::Sample, "sample", &p, out, &raw[..2], grid);
                }
                let best = raw.get(2).copied().ok_or_else(|| {
                    Error::backend(
                        BackendKind::Wgpu,
                        format!("{op}: missing the chunks' buffer"),
                    )
                })?;
                u32_of(op, "greedy pairs", greedy_words(*rows, *vocab))?;
                let chunk_grid = self.grid(op, (rows * chunks) as u64)?;
                self.run(
                    Shader::Sample,
                    "greedy_chunks",
                    &p,
                    best,
                    &raw[..1],
                    chunk_grid,
                )?;
                // `greedy_pick` reads the chunks' pairs at binding 4 (the logits and draws
                // bound before them, unread).
                let inputs = [raw[0], raw[1], best];
                self.run(Shader::Sample, "greedy_pick", &p, out, &inputs, grid)
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not encoded by kernels/sample.rs"),
            )),
        }
    }
}
