// `idot4` written out: the prelude of `@prelude(dot4)` shaders where the platform lacks the
// packed_4x8_integer_dot_product language feature, or `WEBTENSOR_WGPU_INT_DOT=off`.

// The dot product of the four signed bytes of `a` with those of `b`.
fn idot4(a: u32, b: u32) -> i32 {
    let at = vec4<u32>(24u, 16u, 8u, 0u);
    let x = (vec4<i32>(bitcast<i32>(a)) << at) >> vec4<u32>(24u);
    let y = (vec4<i32>(bitcast<i32>(b)) << at) >> vec4<u32>(24u);
    return dot(x, y);
}
