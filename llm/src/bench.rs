//! Whole-model timing for `webtensor bench --model`, beside the op harness of
//! [`webtensor::bench`] whose clock, ceilings and report types it uses. Native only.

/// Prefill and decode timing of one model on each chosen backend.
pub mod model;
/// Decode speed of a model split over several devices (`--model --tp`).
pub mod tensor_parallel;
