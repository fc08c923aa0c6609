//! The read-bandwidth probe of `webtensor bench` (`read_probe.wgsl`): what a shader of ours
//! can stream on this adapter, the ceiling the decode products are read against.

use super::Encoder;
use crate::backend::webgpu::context::MvShape;
use crate::backend::webgpu::params::ReadProbeParams;
use crate::backend::webgpu::pipelines::Shader;
use crate::error::Result;

/// Vec4s each invocation reads per run (four runs, or the same count coalesced).
const PER_LANE: u32 = 64;

/// Bytes one invocation reads.
const BYTES_PER_INVOCATION: u64 = 4 * PER_LANE as u64 * 16;

/// Threads per workgroup of both entries.
const WORKGROUP: u64 = 64;

/// The invocations that read the first `bytes` of a buffer whole: a multiple of the workgroup
/// size, at most the grid's one row. The probe reads `invocations · BYTES_PER_INVOCATION`.
pub(crate) fn probe_invocations(bytes: u64, max_groups: u32) -> u64 {
    let groups = (bytes / (BYTES_PER_INVOCATION * WORKGROUP)).min(u64::from(max_groups));
    groups * WORKGROUP
}

/// Bytes the probe reads with `invocations` invocations.
pub(crate) fn probe_bytes(invocations: u64) -> u64 {
    invocations * BYTES_PER_INVOCATION
}

impl Encoder<'_> {
    /// Records one pass of the probe over `x` with `invocations` (from [`probe_invocations`])
    /// writing one word each into `out`, in the adapter's decode shape: a lane per run on
    /// software adapters, consecutive lanes on consecutive words on GPUs.
    pub(crate) fn read_probe(
        &mut self,
        out: &wgpu::Buffer,
        x: &wgpu::Buffer,
        invocations: u64,
    ) -> Result<()> {
        let entry = match self.ctx.mv_shape() {
            MvShape::Lanes => "read_runs",
            MvShape::SubgroupTeams { .. } | MvShape::WorkgroupTeams => "read_coalesced",
        };
        let p = ReadProbeParams {
            per_lane: PER_LANE,
            ..Default::default()
        };
        let groups = (invocations / WORKGROUP) as u32;
        self.run(Shader::ReadProbe, entry, &p, out, &[x], [groups, 1, 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reads_whole_workgroups_within_the_buffer_and_the_grid() {
        // 64 MiB: 256 workgroups of 64 invocations, 4 KiB each.
        let invocations = probe_invocations(64 << 20, 65535);
        assert_eq!(invocations, 16384);
        assert_eq!(probe_bytes(invocations), 64 << 20);
        // A remainder short of a workgroup's 256 KiB is left unread, never overrun.
        let invocations = probe_invocations((64 << 20) + (255 << 10), 65535);
        assert_eq!(probe_bytes(invocations), 64 << 20);
        // Too small for one workgroup, and a grid capped by the adapter.
        assert_eq!(probe_invocations(255 << 10, 65535), 0);
        assert_eq!(probe_invocations(64 << 20, 100), 6400);
    }
}
