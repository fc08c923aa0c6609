//! Each op family's launches, one module per kernel source file (`kernels/*.cu`); the
//! exhaustive match in `kernels::launch` routes every `OpSpec` to one of them.

pub(super) mod elementwise;
pub(super) mod fused;
pub(super) mod matmul;
pub(super) mod norm;
pub(super) mod quant;
pub(super) mod sample;
pub(super) mod scan;
