//! Every WGSL file in shaders/ parses and validates with naga, so a shader error fails
//! `cargo test` even on machines without a GPU. Each is checked as the backend composes it
//! (`compose_module`: after the constants prelude `shaders/generated/formats.wgsl`).

use std::path::Path;

use webtensor::backend::webgpu::compose_module;

/// Parses and validates one WGSL module; panics with naga's message naming `name`.
fn validate(name: &str, source: &str) -> naga::Module {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{name}: parse error:\n{}", e.emit_to_string(source)));
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{name}: validation error:\n{}", e.emit_to_string(source)));
    module
}

/// The reduction preludes of shaders/reduce/, as (file name, source).
fn preludes(dir: &Path) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = std::fs::read_dir(dir.join("reduce"))
        .expect("shaders/reduce/ exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("wgsl"))
        .map(|p| {
            let source = std::fs::read_to_string(&p).expect("readable prelude");
            (p.display().to_string(), source)
        })
        .collect();
    found.sort();
    found
}

#[test]
fn every_shader_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let preludes = preludes(&dir);
    assert_eq!(preludes.len(), 3, "lanes, subgroup and workgroup preludes");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("shaders/ exists") {
        let path = entry.expect("readable entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let file = std::fs::read_to_string(&path).expect("readable shader");
        let source = compose_module(&file, None);
        let name = path.display().to_string();
        // A shader marked `@prelude(reduce)` is compiled after each prelude (the backend picks
        // one by the adapter's subgroups); each composition must validate.
        let modules: Vec<naga::Module> = if source.contains("// @prelude(reduce)") {
            preludes
                .iter()
                .map(|(pname, prelude)| {
                    validate(
                        &format!("{pname} + {name}"),
                        &compose_module(&file, Some(prelude)),
                    )
                })
                .collect()
        } else {
            vec![validate(&name, &source)]
        };
        for module in modules {
            assert!(
                module
                    .entry_points
                    .iter()
                    .any(|ep| ep.stage == naga::ShaderStage::Compute),
                "{name}: has no compute entry point"
            );
        }
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
