//! Encoding `shaders/sample.wgsl`: token sampling.

use super::{u32_of, Encoder, Shader};
use crate::backend::webgpu::params::SampleParams;
use crate::backend::BackendKind;
use crate::backend::OpSpec;
use crate::error::{Error, Result};

impl Encoder<'_> {
    /// Records one op of this family reading `raw` and writing `out`.
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
                let p = SampleParams {
                    rows: u32_of(op, "rows", *rows)?,
                    vocab: u32_of(op, "vocab", *vocab)?,
                    temperature: params.temperature,
                    top_k: params.top_k,
                    top_p: params.top_p,
                    greedy: params.is_greedy() as u32,
                    ..Default::default()
                };
                u32_of(op, "rows·vocab", rows * vocab)?;
                let grid = self.grid(op, *rows as u64)?;
                self.run(Shader::Sample, "sample", &p, out, &raw[..2], grid)
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not encoded by kernels/sample.rs"),
            )),
        }
    }
}
