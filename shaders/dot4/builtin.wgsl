// `idot4` as WGSL's `dot4I8Packed`: the prelude of `@prelude(dot4)` shaders where the
// platform offers the packed_4x8_integer_dot_product language feature (every native wgpu:
// naga writes the hardware instruction where the device has it and its own unpacking where
// not; in browsers, where `wgslLanguageFeatures` lists it).

// The dot product of the four signed bytes of `a` with those of `b`.
fn idot4(a: u32, b: u32) -> i32 {
    return dot4I8Packed(a, b);
}
