//! Whole-model timing for `webtensor bench --model`, beside the op harness of
//! [`webtensor::bench`] whose clock, ceilings and report types it uses. Native only.

pub mod model;
pub mod tensor_parallel;
