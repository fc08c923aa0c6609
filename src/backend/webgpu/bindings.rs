//! What a dispatch binds, and the bind group that binds it: shared by the recorder (which
//! caches bind groups by what they bind) and by captured steps (which build theirs once, over
//! their own parameter buffer).

use std::num::NonZeroU64;

/// What a bind group binds after the parameters: (buffer, offset, size) per buffer binding
/// (size 0 binds the whole buffer), then the texture of a kernel that has one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    pub(crate) buffers: Vec<(wgpu::Buffer, u64, u64)>,
    pub(crate) texture: Option<wgpu::TextureView>,
}

/// A bind group of `layout` binding `params` (a block of `params_bytes`, the kernels'
/// `PARAMS_BYTES`, at a dynamic offset) at binding 0 and `key`'s buffers and texture after it.
pub(crate) fn bind_group(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    (params, params_bytes): (&wgpu::Buffer, u64),
    key: &BindKey,
) -> wgpu::BindGroup {
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: params,
            offset: 0,
            size: NonZeroU64::new(params_bytes),
        }),
    }];
    entries.extend(
        key.buffers
            .iter()
            .enumerate()
            .map(|(i, (buffer, offset, size))| wgpu::BindGroupEntry {
                binding: 1 + i as u32,
                resource: match NonZeroU64::new(*size) {
                    None => buffer.as_entire_binding(),
                    Some(size) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer,
                        offset: *offset,
                        size: Some(size),
                    }),
                },
            }),
    );
    if let Some(view) = &key.texture {
        entries.push(wgpu::BindGroupEntry {
            binding: 1 + key.buffers.len() as u32,
            resource: wgpu::BindingResource::TextureView(view),
        });
    }
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout,
        entries: &entries,
    })
}
