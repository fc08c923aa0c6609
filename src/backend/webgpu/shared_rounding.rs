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
//! ([`Handle::Id`]), so a tensor dropped and its buffer recycled never matches, and an in-place
//! write into either ([`SharedRounding::forget_writes_to`], the only way storage changes after
//! it is written) forgets the rounding. The table itself is held, so no other op reuses it.

use std::sync::Mutex;

use crate::backend::{Activations, OpSpec};

/// A tensor's storage as the memory sees it: a handle that is cloned to be held, and an
/// identity that names the storage without keeping it alive (`GpuBuffer` and `BufferId` in
/// `pool.rs`).
pub(crate) trait Handle: Clone {
    type Id;
    /// The identity of this storage.
    fn id(&self) -> Self::Id;
    /// Whether this handle is of the storage `id` names.
    fn is(&self, id: &Self::Id) -> bool;
}

/// What must match for a rounding to serve another product.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key {
    eps_bits: u32,
    m: usize,
    k: usize,
    activations: Activations,
}

/// The last normed rounding: its rows, norm weight, key, and the table it wrote.
struct Rounded<H: Handle> {
    rows: H::Id,
    weight: H::Id,
    key: Key,
    table: H,
}

/// The backend's memory of its last normed rounding, over storage handles `H`.
pub(crate) struct SharedRounding<H: Handle> {
    last: Mutex<Option<Rounded<H>>>,
}

impl<H: Handle> Default for SharedRounding<H> {
    fn default() -> Self {
        SharedRounding {
            last: Mutex::new(None),
        }
    }
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

impl<H: Handle> SharedRounding<H> {
    /// The table already holding the rounding that the normed product `spec` of `inputs`
    /// would write, if the last rounding was of the same rows and norm.
    pub(crate) fn find(&self, spec: &OpSpec, inputs: &[&H]) -> Option<H> {
        let key = key(spec)?;
        let last = self.last.lock().ok()?;
        let r = last.as_ref()?;
        (r.key == key && inputs.first()?.is(&r.rows) && inputs.get(2)?.is(&r.weight))
            .then(|| r.table.clone())
    }

    /// Remembers `table` as the rounding the normed product `spec` of `inputs` just recorded.
    pub(crate) fn remember(&self, spec: &OpSpec, inputs: &[&H], table: &H) {
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

    /// Forgets the rounding, whatever it was (its table is then no longer held here).
    pub(crate) fn forget(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = None;
        }
    }

    /// Forgets the rounding if `target`, about to be written in place, holds its rows or its
    /// norm weight.
    pub(crate) fn forget_writes_to(&self, target: &H) {
        if let Ok(mut last) = self.last.lock() {
            if last
                .as_ref()
                .is_some_and(|r| target.is(&r.rows) || target.is(&r.weight))
            {
                *last = None;
            }
        }
    }
}
