//! Encoding the scans (`shaders/scan.wgsl`): three dispatches per scan — chunk totals, the
//! carries across chunks, then each chunk from its carry — and the two gradient kernels.

use super::{u32_of, Encoder, Operand, Shader};
use crate::backend::webgpu::params::ScanParams;
use crate::backend::BackendKind;
use crate::backend::{OpSpec, ScanOp};
use crate::error::{Error, Result};

/// Steps per chunk (one workgroup of 256 threads, two steps each).
const CHUNK: usize = 512;
/// Threads per workgroup.
const WG: u64 = 256;
/// Scans up to this length run one thread per channel (`scan_serial`).
const SERIAL_MAX: usize = 64;
/// Chunk totals one `scan_carry` workgroup can fold (512 runs of at most 128 totals, keeping
/// each invocation's loops far below lavapipe's 65,535-iteration cut-off).
const MAX_CHUNKS: usize = 512 * 128;

/// Floats of the temporary buffer a scan over `channels × len` needs (a state per chunk).
pub(in crate::backend::webgpu) fn scan_temp_len(channels: usize, len: usize) -> usize {
    2 * channels * len.div_ceil(CHUNK)
}

/// Inputs of a scan before the backend's chunk-state buffer.
fn scan_inputs(op: ScanOp) -> usize {
    match op {
        ScanOp::Linear => 3,
        ScanOp::LinearAdjoint => 2,
        _ => 1,
    }
}

fn op_code(op: ScanOp) -> u32 {
    match op {
        ScanOp::Linear => 0,
        ScanOp::LinearAdjoint => 1,
        ScanOp::LogCumprod => 2,
        ScanOp::LogCumSumExp => 3,
    }
}

impl Encoder<'_> {
    /// Records a scan or one of its gradient kernels.
    pub(super) fn scan(
        &mut self,
        spec: &OpSpec,
        out: &wgpu::Buffer,
        inputs: &[Operand<'_>],
    ) -> Result<()> {
        let op = spec.kind().name();
        let params = |code: u32, outer: usize, len: usize, inner: usize| -> Result<ScanParams> {
            u32_of(op, "elements", outer * len * inner)?;
            Ok(ScanParams {
                op: code,
                outer: u32_of(op, "outer", outer)?,
                len: u32_of(op, "len", len)?,
                inner: u32_of(op, "inner", inner)?,
                chunks: u32_of(op, "chunks", len.div_ceil(CHUNK))?,
                ..Default::default()
            })
        };
        match *spec {
            OpSpec::Scan {
                op: scan,
                outer,
                len,
                inner,
            } => {
                let chunks = len.div_ceil(CHUNK);
                if chunks > MAX_CHUNKS {
                    return Err(Error::invalid(
                        op,
                        format!(
                            "a scan of {len} steps is longer than the wgpu kernels handle \
                             ({} steps); split the sequence",
                            MAX_CHUNKS * CHUNK
                        ),
                    ));
                }
                let p = params(op_code(scan), outer, len, inner)?;
                let channels = (outer * inner) as u64;
                let (x, y) = match scan {
                    ScanOp::Linear | ScanOp::LinearAdjoint => (inputs[0].buffer, inputs[1].buffer),
                    _ => (inputs[0].buffer, inputs[0].buffer),
                };
                let h0 = if scan == ScanOp::Linear {
                    inputs[2].buffer
                } else {
                    x
                };
                let temp = inputs
                    .get(scan_inputs(scan))
                    .map(|o| o.buffer)
                    .ok_or_else(|| {
                        Error::backend(BackendKind::Wgpu, "scan: missing the chunk-state buffer")
                    })?;
                if len <= SERIAL_MAX {
                    let grid = self.grid(op, channels.div_ceil(WG))?;
                    return self.run(Shader::Scan, "scan_serial", &p, out, &[x, y, h0], grid);
                }
                let tiles = self.grid(op, channels * chunks as u64)?;
                self.run(Shader::Scan, "scan_reduce", &p, temp, &[x, y], tiles)?;
                let per_channel = self.grid(op, channels)?;
                self.run(Shader::Scan, "scan_carry", &p, temp, &[h0], per_channel)?;
                self.run(Shader::Scan, "scan_apply", &p, out, &[x, y, temp], tiles)
            }
            OpSpec::ScanGradA { outer, len, inner } => {
                let p = params(0, outer, len, inner)?;
                let grid = self.grid(op, ((outer * len * inner) as u64).div_ceil(WG))?;
                let raw: Vec<_> = inputs.iter().take(3).map(|o| o.buffer).collect();
                self.run(Shader::Scan, "scan_grad_a", &p, out, &raw, grid)
            }
            OpSpec::ScanGradInit { outer, len, inner } => {
                let p = params(0, outer, len, inner)?;
                let grid = self.grid(op, ((outer * inner) as u64).div_ceil(WG))?;
                let raw: Vec<_> = inputs.iter().take(2).map(|o| o.buffer).collect();
                self.run(Shader::Scan, "scan_grad_init", &p, out, &raw, grid)
            }
            _ => Err(Error::backend(
                BackendKind::Wgpu,
                format!("{op} is not a scan"),
            )),
        }
    }
}
