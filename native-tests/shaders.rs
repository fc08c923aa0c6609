//! Every WGSL file in shaders/ parses and validates with naga, so a shader error fails
//! `cargo test` even on machines without a GPU.

use std::path::Path;

#[test]
fn every_shader_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("shaders/ exists") {
        let path = entry.expect("readable entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("readable shader");
        let name = path.display();
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{name}: parse error:\n{}", e.emit_to_string(&source)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: validation error:\n{}", e.emit_to_string(&source)));
        assert!(
            module
                .entry_points
                .iter()
                .any(|ep| ep.stage == naga::ShaderStage::Compute),
            "{name}: has no compute entry point"
        );
        checked += 1;
    }
    assert!(
        checked >= 8,
        "expected a shader per op family in {}, found {checked}",
        dir.display()
    );
}

#[test]
fn a_broken_shader_is_rejected() {
    // The check above must be able to fail: a type error is caught by the validator or parser.
    let source = "@compute @workgroup_size(1) fn main() { let x: f32 = 1u; }";
    let rejected = match naga::front::wgsl::parse_str(source) {
        Err(_) => true,
        Ok(module) => naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .is_err(),
    };
    assert!(rejected);
}
