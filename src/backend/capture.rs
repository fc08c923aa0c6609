//! Recorded work a backend can run again: the decode step of a model, recorded once as it
//! runs and replayed for every later token with the same kernels on the same memory, so the
//! host no longer builds each op (shapes, buffers, parameters, bindings) token after token.
//!
//! A backend that records (wgpu; cuda, as a CUDA graph) keeps, between
//! [`super::Backend::begin_capture`] and [`super::Backend::end_capture`], every kernel it
//! records with its bindings and parameters, and the temporary memory those bind.
//! [`super::Backend::replay`] records the same kernels again. What differs from one step to the next must therefore live in memory the step
//! reads (token ids, positions, cache rows: written before each step with
//! [`super::Backend::write`] and [`super::Backend::copy_into`]) rather than in the recorded
//! parameters. The one parameter a replay sets is the number of keys attention sees
//! ([`crate::backend::AttentionSpec::n`]), which grows by one each step; the row table
//! attention reads is as long as the cache ([`crate::backend::AttentionSpec::stride`]).

use std::any::Any;
use std::fmt;

use super::BackendKind;
use crate::error::{Error, Result};

/// The work a backend recorded between `begin_capture` and `end_capture`, ready to be replayed
/// by the same backend instance.
pub struct CapturedStep {
    /// The backend that recorded it.
    pub(crate) kind: BackendKind,
    /// The backend's own record of it ([`CapturedStep::replay_args`]).
    pub(crate) work: Box<dyn Any + Send + Sync>,
    /// Kernel dispatches one replay records.
    pub(crate) dispatches: usize,
}

impl CapturedStep {
    /// Kernel dispatches one replay records.
    pub fn dispatches(&self) -> usize {
        self.dispatches
    }

    /// What a replay on `kind` needs: the record `kind` kept (of type `T`), and the key count
    /// as the 32 bits kernels take. An error when another backend recorded the step.
    #[cfg_attr(
        all(target_arch = "wasm32", target_feature = "atomics"),
        allow(
            dead_code,
            reason = "the threaded wasm build has no backend that records"
        )
    )]
    pub(crate) fn replay_args<T: Any>(&self, kind: BackendKind, keys: usize) -> Result<(&T, u32)> {
        let Some(work) = self.work.downcast_ref::<T>() else {
            return Err(Error::backend(
                kind,
                format!("replay: the step was captured by {}", self.kind),
            ));
        };
        let keys = u32::try_from(keys)
            .map_err(|_| Error::backend(kind, "replay: the key count exceeds 32 bits"))?;
        Ok((work, keys))
    }
}

impl fmt::Debug for CapturedStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapturedStep")
            .field("backend", &self.kind)
            .field("dispatches", &self.dispatches)
            .finish_non_exhaustive()
    }
}
