//! How fast a wgpu adapter's shaders read memory three ways: a storage buffer as `vec4<u32>`,
//! the same as four `u32` loads (how the products in `shaders/quant/` read packed weights), and an
//! `rgba32uint` texture through `textureLoad`. Each of 4096 lanes reads 256 consecutive
//! 16-byte units (16 MiB in all) and folds them into one word; the best of 5 dispatches is
//! printed for each path, three times alternating.
//!
//! On a CPU adapter every buffer load at a run-time offset is a per-lane gather with a branch
//! per lane (see `docs/wgpu-decode-profile.md`); a texel fetch goes through the driver's
//! sampling routine instead. Run it per adapter, e.g.
//! `VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json WGPU_BACKEND=vulkan cargo run
//! --release --example load_paths`.
use std::time::Instant;
use wgpu::util::DeviceExt;

const SHADER: &str = r#"
struct P { words: u32, lanes: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> buf: array<vec4<u32>>;
@group(0) @binding(3) var tex: texture_2d<u32>;

@compute @workgroup_size(16)
fn from_buffer(@builtin(global_invocation_id) g: vec3<u32>) {
    let lane = g.x;
    var acc = vec4<u32>();
    var i = lane * p.words;
    let end = i + p.words;
    for (; i < end; i = i + 1u) {
        acc = acc ^ (buf[i] + acc);
    }
    out[lane] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}

@group(0) @binding(4) var<storage, read> words: array<u32>;

@compute @workgroup_size(16)
fn from_words(@builtin(global_invocation_id) g: vec3<u32>) {
    let lane = g.x;
    var acc = vec4<u32>();
    var i = 4u * lane * p.words;
    let end = i + 4u * p.words;
    for (; i < end; i = i + 4u) {
        acc = acc ^ (vec4<u32>(words[i], words[i + 1u], words[i + 2u], words[i + 3u]) + acc);
    }
    out[lane] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}

@compute @workgroup_size(16)
fn from_texture(@builtin(global_invocation_id) g: vec3<u32>) {
    let lane = g.x;
    var acc = vec4<u32>();
    let first = lane * p.words;
    let y = first / 4096u;
    var x = first % 4096u;
    let end = x + p.words;
    for (; x < end; x = x + 1u) {
        acc = acc ^ (textureLoad(tex, vec2<u32>(x, y), 0) + acc);
    }
    out[lane] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
"#;

/// Dispatches per path and timing: the best of these is printed.
const SAMPLES: usize = 5;

fn main() {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("no wgpu adapter: on a machine without a GPU, install lavapipe (scripts/setup.sh)");
    println!("{:?}", adapter.get_info().name);
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default())).unwrap();
    let lanes: u32 = 4096;
    // 16-byte units per lane: 16 MiB in all.
    let words: u32 = 256;
    let total = (lanes * words) as usize;
    let data: Vec<u32> = (0..total * 4)
        .map(|i| (i as u32).wrapping_mul(2654435761))
        .collect();
    let buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&data),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let rows = (total as u32).div_ceil(4096);
    let tex = device.create_texture_with_data(
        &queue,
        &wgpu::TextureDescriptor {
            label: None,
            size: wgpu::Extent3d {
                width: 4096,
                height: rows,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING,
            view_formats: &[],
        },
        Default::default(),
        bytemuck::cast_slice(&data),
    );
    let view = tex.create_view(&Default::default());
    let params = [words, lanes, 0, 0];
    let ubuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&params),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: lanes as u64 * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    for entry in ["from_buffer", "from_words", "from_texture"].repeat(3) {
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ubuf.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: out.as_entire_binding(),
            },
        ];
        if entry == "from_buffer" {
            entries.push(wgpu::BindGroupEntry {
                binding: 2,
                resource: buf.as_entire_binding(),
            });
        } else if entry == "from_words" {
            entries.push(wgpu::BindGroupEntry {
                binding: 4,
                resource: buf.as_entire_binding(),
            });
        } else {
            entries.push(wgpu::BindGroupEntry {
                binding: 3,
                resource: wgpu::BindingResource::TextureView(&view),
            });
        }
        let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        let mut best = f64::MAX;
        for _ in 0..SAMPLES {
            let mut enc = device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(lanes / 16, 1, 1);
            }
            let t = Instant::now();
            queue.submit([enc.finish()]);
            device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let bytes = (total * 16) as f64;
        println!(
            "{entry}: {:.2} ms, {:.2} GB/s",
            best * 1e3,
            bytes / best / 1e9
        );
    }
}
