//! One int8 rounding of a layer's normed input for every product that reads it.
//!
//! On CPU adapters a normed product ([`OpSpec::NormLinear`], [`OpSpec::NormLinearInto`]) norms
//! and rounds its activation rows in a dispatch of its own (`quantize_acts_normed`) before the
//! product reads them. A decode layer's q, k and v products norm and round the same rows with
//! the same norm, three times. So the backend remembers the last such rounding, and a normed
//! product of the same rows, norm weight, eps, shape and activation mode reads its table
//! instead of rounding again: two dispatches fewer per layer.
//!
//! Sameness is identity of storage: the rows and the norm weight are held weakly
//! ([`BufferId`]), so a tensor dropped and its buffer recycled never matches, and an in-place
//! write into either ([`SharedRounding::forget_writes_to`], the only way storage changes after
//! it is written) forgets the rounding. The table itself is held, so no other op reuses it.

use std::sync::Mutex;

use super::pool::{BufferId, GpuBuffer};
use crate::backend::{Activations, OpSpec};

/// What must match for a rounding to serve another product.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key {
    eps_bits: u32,
    m: usize,
    k: usize,
    activations: Activations,
}

/// The last normed rounding: its rows, norm weight, key, and the table it wrote.
#[derive(Debug)]
struct Rounded {
    rows: BufferId,
    weight: BufferId,
    key: Key,
    table: GpuBuffer,
}

/// The backend's memory of its last normed rounding.
#[derive(Debug, Default)]
pub(crate) struct SharedRounding {
    last: Mutex<Option<Rounded>>,
}

/// The key of a normed product (whose inputs are `a`, `w`, the norm's weight, ...); `None` for
/// any other op.
fn key(spec: &OpSpec) -> Option<Key> {
    let l = match spec {
        OpSpec::NormLinear(l) | OpSpec::NormLinearInto { l, .. } => l,
        _ => return None,
    };
    Some(Key {
        eps_bits: l.norm?.eps.to_bits(),
        m: l.m,
        k: l.k,
        activations: l.activations,
    })
}

impl SharedRounding {
    /// The table already holding the rounding that the normed product `spec` of `inputs`
    /// would write, if the last rounding was of the same rows and norm.
    pub(crate) fn find(&self, spec: &OpSpec, inputs: &[&GpuBuffer]) -> Option<GpuBuffer> {
        let key = key(spec)?;
        let last = self.last.lock().ok()?;
        let r = last.as_ref()?;
        (r.key == key && r.rows.is(inputs.first()?) && r.weight.is(inputs.get(2)?))
            .then(|| r.table.clone())
    }

    /// Remembers `table` as the rounding the normed product `spec` of `inputs` just recorded.
    pub(crate) fn remember(&self, spec: &OpSpec, inputs: &[&GpuBuffer], table: &GpuBuffer) {
        let (Some(key), Some(rows), Some(weight)) = (key(spec), inputs.first(), inputs.get(2))
        else {
            return;
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some(Rounded {
                rows: rows.id(),
                weight: weight.id(),
                key,
                table: table.clone(),
            });
        }
    }

    /// Forgets the rounding if `target`, about to be written in place, holds its rows or its
    /// norm weight.
    pub(crate) fn forget_writes_to(&self, target: &GpuBuffer) {
        if let Ok(mut last) = self.last.lock() {
            if last
                .as_ref()
                .is_some_and(|r| r.rows.is(target) || r.weight.is(target))
            {
                *last = None;
            }
        }
    }
}
