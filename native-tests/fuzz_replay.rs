//! Replays every committed fuzz input through the entry points the fuzz targets drive
//! (`fuzz/entries.rs`), on stable, as an ordinary test: the corpora under `fuzz/corpus/<target>/`
//! and the crash reproducers under `fuzz/artifacts/<target>/`. A reproducer that panics again
//! fails here, so a fixed crash stays fixed without nightly or cargo-fuzz.

#[path = "../fuzz/entries.rs"]
mod entries;

use std::path::Path;

#[test]
fn every_corpus_and_reproducer_file_returns() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("fuzz");
    let mut replayed = 0;
    for (target, entry) in entries::TARGETS {
        for folder in ["corpus", "artifacts"] {
            let dir = root.join(folder).join(target);
            let Ok(list) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut paths: Vec<_> = list.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths.iter().filter(|p| p.is_file()) {
                let data = std::fs::read(path).unwrap();
                let outcome = std::panic::catch_unwind(|| entry(&data));
                assert!(outcome.is_ok(), "{target}: {} panics", path.display());
                replayed += 1;
            }
        }
    }
    // The corpora are committed: an empty replay means they went missing.
    assert!(
        replayed >= entries::TARGETS.len(),
        "replayed only {replayed} files"
    );
    eprintln!("replayed {replayed} fuzz inputs");
}
