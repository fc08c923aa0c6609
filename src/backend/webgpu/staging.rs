//! Small host writes that keep their place in the recording.
//!
//! `queue.write_buffer` does not land where it is called: it lands at the next submit, before
//! that submit's commands (see `recorder`). A write into memory that recorded, unsubmitted work
//! still reads would overtake that work, so a plain `write_buffer` needs a submit first, and a
//! decode step whose inputs are written before it (its position, its cache rows, the key count
//! of its attention) would be a submit of its own.
//!
//! Instead a small write is staged: its bytes are appended to a host-side arena, and a copy
//! from the arena's device buffer into the target is recorded where the write was asked for.
//! At submit the arena is written with one `write_buffer` just before the batch it belongs to,
//! so every copy reads what was staged for it, and the copies run in recording order. The
//! previous batch, submitted earlier, has finished reading the arena's old contents by then
//! (queue order). So many decode steps, each with its inputs, share one submit.

/// Bytes of the staging arena per submit.
const STAGING_BYTES: u64 = 256 << 10;

/// Writes larger than this go by `write_buffer` after a submit instead of filling the arena.
pub(crate) const MAX_STAGED_WRITE: usize = 64 << 10;

/// The staging arena: bytes staged since the last submit, and the buffer they are copied from.
#[derive(Debug)]
pub(crate) struct Staging {
    bytes: Vec<u8>,
    buffer: wgpu::Buffer,
}

impl Staging {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("webtensor staged writes"),
            size: STAGING_BYTES,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Staging {
            bytes: Vec::new(),
            buffer,
        }
    }

    /// Whether `bytes` more fit before the next submit.
    pub(crate) fn has_room(&self, bytes: usize) -> bool {
        (self.bytes.len() + bytes) as u64 <= STAGING_BYTES
    }

    /// Stages `data` (a multiple of 4 bytes that [`Staging::has_room`] for): the offset in
    /// [`Staging::buffer`] to copy it from.
    pub(crate) fn stage(&mut self, data: &[u8]) -> u64 {
        let at = self.bytes.len() as u64;
        self.bytes.extend_from_slice(data);
        at
    }

    /// The device buffer staged bytes are copied from.
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Writes what was staged into the arena's buffer, to land before the next submit's
    /// commands; the arena is empty again.
    pub(crate) fn flush(&mut self, queue: &wgpu::Queue) {
        if !self.bytes.is_empty() {
            queue.write_buffer(&self.buffer, 0, &self.bytes);
            self.bytes.clear();
        }
    }
}
