//! Q4_0 weights as texels for the int8 products of CPU adapters.
//!
//! lavapipe and SwiftShader load a storage word at a run-time offset lane by lane, a branch
//! and a scalar load each, while a texel fetch goes through their sampling routine: 16 bytes
//! per lane and no branch. So on the lanes shape ([`super::context::MvShape::Lanes`]) an
//! uploaded Q4_0 tensor also gets a copy laid out for fetches, and its products with int8
//! activations read that (`shaders/quant/`): decode in `mv_pairs_texels`, about 30%
//! faster on both adapters, and prefill in `mv_texels`, about 1.9 times faster on SwiftShader; for
//! the copy's memory (as much again as the tensor). The storage buffer stays: every other
//! kernel (f32 activations, the embedding gather, dequantize) reads it. A block's scale is
//! the half of word `b / 2` that `b`'s parity names.
//!
//! The layout needs no shape, only the bytes: block `b`'s 16 quant bytes are the `rgba32uint`
//! texel `b` of a texture [`TEXELS_WIDTH`] texels wide (row-major), and word `p` of a storage
//! buffer holds the f16 scales of blocks `2p` (low half) and `2p + 1` (high half). A product
//! whose rows have an even count of blocks finds a row's pair `i` at texel `row · blocks + 2i`
//! and scale word `row · blocks / 2 + i`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use wgpu::util::DeviceExt;

use crate::dtype::DType;

/// Texels per row of the texture (`2^TEXELS_WIDTH_LOG2` in `shaders/quant/`).
pub(crate) const TEXELS_WIDTH: u32 = 4096;

/// A Q4_0 tensor's texel copy: the quant bytes as a texture and the scales as words.
#[derive(Debug)]
pub(crate) struct WeightTexels {
    /// The `texture_2d<u32>` view `mv_pairs_texels` and `mv_texels` bind.
    pub(crate) view: wgpu::TextureView,
    /// The scales, two f16 per word.
    pub(crate) scales: wgpu::Buffer,
    /// The buffer pool's release counter, counted up when the copy is dropped: cached bind
    /// groups may hold it, and the recorder empties its cache when the count moves.
    releases: Weak<AtomicU64>,
}

impl Drop for WeightTexels {
    fn drop(&mut self) {
        if let Some(releases) = self.releases.upgrade() {
            releases.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl WeightTexels {
    /// The texel copy of the Q4_0 blocks in `bytes`, or `None` where it does not fit: an odd
    /// count of blocks, a texture taller than the device allows, or a scale buffer larger than
    /// one binding (the products then read the storage buffer). The texture's contents are
    /// written with `queue.write_texture`, which lands before the next submit's commands: the
    /// texture is new, so no recorded work reads it yet.
    pub(super) fn of_q4_0(
        (device, queue, limits): (&wgpu::Device, &wgpu::Queue, &wgpu::Limits),
        releases: &Arc<AtomicU64>,
        bytes: &[u8],
    ) -> Option<WeightTexels> {
        let block_bytes = DType::Q4_0.block_bytes();
        let blocks = bytes.len() / block_bytes;
        if blocks == 0 || !blocks.is_multiple_of(2) || !bytes.len().is_multiple_of(block_bytes) {
            return None;
        }
        let width = TEXELS_WIDTH as usize;
        let height = blocks.div_ceil(width);
        let scale_bytes = (blocks / 2 * 4) as u64;
        if width > limits.max_texture_dimension_2d as usize
            || height > limits.max_texture_dimension_2d as usize
            || scale_bytes > limits.max_storage_buffer_binding_size
        {
            return None;
        }
        let mut quants = vec![0u8; width * height * 16];
        let mut scales = Vec::with_capacity(blocks * 2);
        for (block, texel) in bytes
            .chunks_exact(block_bytes)
            .zip(quants.chunks_exact_mut(16))
        {
            scales.extend_from_slice(&block[..2]);
            texel.copy_from_slice(&block[2..]);
        }
        let texture = device.create_texture(&wgpu::TextureDescriptor {
            label: Some("webtensor Q4_0 texels"),
            size: wgpu::Extent3d {
                width: TEXELS_WIDTH,
                height: height as u32,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        queue.write_texture(
            texture.as_image_copy(),
            &quants,
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(TEXELS_WIDTH * 16),
                rows_per_image: None,
            },
            texture.size(),
        );
        let scales = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("webtensor Q4_0 texel scales"),
            contents: &scales,
            usage: wgpu::BufferUsages::STORAGE,
        });
        Some(WeightTexels {
            view: texture.create_view(&Default::default()),
            scales,
            releases: Arc::downgrade(releases),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::webgpu::texels::TEXELS_WIDTH;

    /// The shader addresses texels with a mask and a shift of this width.
    #[test]
    fn the_width_is_the_shaders_power_of_two() {
        let wgsl = include_str!("../../../shaders/quant/cpu_adapters.wgsl");
        let log2 = TEXELS_WIDTH.trailing_zeros();
        assert!(TEXELS_WIDTH.is_power_of_two());
        assert!(
            wgsl.contains(&format!("const TEXELS_WIDTH_LOG2: u32 = {log2}u;")),
            "shaders/quant/cpu_adapters.wgsl's TEXELS_WIDTH_LOG2 must be {log2}"
        );
    }
}
