//! Every WGSL module the backend compiles parses and validates with naga, so a shader error
//! fails `cargo test` even on machines without a GPU. Each is checked as the backend composes
//! it (`compose_module`: after the constants prelude `shaders/generated/formats.wgsl`), and
//! every `.wgsl` file under shaders/ is part of a module or a prelude.

use std::path::Path;

use webtensor::backend::webgpu::{compose_module, shader_modules};

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

/// The preludes in `shaders/<kind>/`, as (file name, source).
fn preludes(dir: &Path, kind: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = std::fs::read_dir(dir.join(kind))
        .unwrap_or_else(|e| panic!("shaders/{kind}/: {e}"))
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

/// The choices for one `@prelude(kind)` line: each prelude of the kind when `source` asks
/// for it, else none.
fn choices(source: &str, kind: &str, all: &[(String, String)]) -> Vec<Option<(String, String)>> {
    if source.contains(&format!("// @prelude({kind})")) {
        all.iter().cloned().map(Some).collect()
    } else {
        vec![None]
    }
}

#[test]
fn every_shader_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let reduce = preludes(&dir, "reduce");
    assert_eq!(reduce.len(), 3, "lanes, subgroup and workgroup preludes");
    let dot4 = preludes(&dir, "dot4");
    assert_eq!(dot4.len(), 2, "builtin and portable idot4 preludes");
    let rotary = preludes(&dir, "rotary");
    assert_eq!(rotary.len(), 1, "the sin_cos prelude");
    let kquants = preludes(&dir, "kquants");
    assert_eq!(kquants.len(), 1, "the K-quant decode prelude");
    let modules = shader_modules();
    let mut checked = 0;
    for &(name, file) in &modules {
        // A shader marked `@prelude(reduce)` is compiled after each reduction prelude (the
        // backend picks one by the adapter's subgroups), one marked `@prelude(dot4)` after
        // each `idot4` prelude (picked by the platform's WGSL features); each composition
        // must validate.
        let mut composed = Vec::new();
        for r in choices(file, "reduce", &reduce) {
            for d in choices(file, "dot4", &dot4) {
                for s in choices(file, "rotary", &rotary) {
                    for kq in choices(file, "kquants", &kquants) {
                        let chosen: Vec<&(String, String)> = r
                            .iter()
                            .chain(d.iter())
                            .chain(s.iter())
                            .chain(kq.iter())
                            .collect();
                        let names: Vec<&str> = chosen.iter().map(|(n, _)| n.as_str()).collect();
                        let sources: Vec<&str> = chosen.iter().map(|(_, s)| s.as_str()).collect();
                        let what = format!("{} + {name}", names.join(" + "));
                        composed.push(validate(&what, &compose_module(file, &sources)));
                    }
                }
            }
        }
        for module in composed {
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
        "expected a shader per op family, found {checked}"
    );
    // No file is left out: each of shaders/*.wgsl and shaders/quant/*.wgsl is (part of) a
    // module; the preludes' folders were read above.
    for folder in [dir.clone(), dir.join("quant")] {
        for entry in std::fs::read_dir(&folder).expect("the shader folder exists") {
            let path = entry.expect("readable entry").path();
            if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable shader");
            assert!(
                modules
                    .iter()
                    .any(|(_, source)| source.contains(text.trim())),
                "{} is in no module the backend compiles",
                path.display()
            );
        }
    }
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
