//! Hostile inputs: model files, indexes and sizes written here to lie in one way each. Every
//! one must give a typed error that names what is wrong, never a panic, an abort on a failed
//! allocation, or a model whose numbers silently changed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

mod common;
#[path = "common/tiny.rs"]
mod tiny;

use tiny::{f32_bytes, tiny_meta, tiny_tensors, u, RawTensors, FFN, HIDDEN, VOCAB};
use webtensor::{BackendKind, DType, Device, Error, Shape, Tensor};
use webtensor_llm::gguf::{self, GgufArray, GgufValue};
use webtensor_llm::weights::StoredDType;
use webtensor_llm::{safetensors, FileBytes, Llama, ModelFiles};

fn gguf_bytes(meta: &[(String, GgufValue)], tensors: &RawTensors) -> Vec<u8> {
    gguf::write(meta, tensors).expect("the test writes valid types")
}

fn open_gguf(bytes: Vec<u8>) -> Result<ModelFiles, Error> {
    ModelFiles::from_gguf("hostile.gguf", FileBytes::Owned(bytes))
}

/// Opens and loads on the cpu: the error of whichever step refuses.
fn load_gguf(bytes: Vec<u8>) -> Result<Llama, Error> {
    Llama::load(&Device::cpu(), open_gguf(bytes)?)
}

fn expect_error(what: &str, result: Result<impl Sized, Error>, needle: &str) -> String {
    let err = match result {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(needle),
        "{what}: {err:?} does not mention {needle:?}"
    );
    eprintln!("{what}: {err}");
    err
}

#[test]
fn the_tiny_model_loads_and_runs() {
    let model = load_gguf(gguf_bytes(&tiny_meta(&[]), &tiny_tensors(1, 8, 8))).unwrap();
    let logits: Vec<f32> = model.logits(&[1, 2, 3]).unwrap().to_vec().unwrap();
    assert_eq!(logits.len(), 3 * VOCAB);
    assert!(logits.iter().all(|v| v.is_finite()));
}

#[test]
fn sizes_from_files_never_overflow() {
    // A layer count no file could hold.
    let meta = tiny_meta(&[("llama.block_count", u(1 << 60))]);
    let bytes = gguf_bytes(&meta, &tiny_tensors(1, 8, 8));
    expect_error("2^60 layers", load_gguf(bytes), "layers");

    // head_dim 2^63: heads · head_dim wraps to 0, and zero-row attention tensors would fit.
    let meta = tiny_meta(&[("llama.rope.dimension_count", u(1 << 63))]);
    let bytes = gguf_bytes(&meta, &tiny_tensors(1, 0, 0));
    expect_error("head_dim 2^63", load_gguf(bytes), "head_dim");

    // A Q8_0 tensor whose byte size (count / 32 · 34) overflows.
    let mut tensors = tiny_tensors(1, 8, 8);
    tensors.push((
        "huge".into(),
        StoredDType::Packed(DType::Q8_0),
        vec![(1 << 32) - 1, 1 << 32],
        vec![0; 50],
    ));
    let bytes = gguf_bytes(&tiny_meta(&[]), &tensors);
    expect_error("Q8_0 byte size overflow", open_gguf(bytes), "`huge`");

    // safetensors: 2^62 f32 values are 2^64 bytes, which wraps to 0.
    let header = r#"{"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}}"#;
    let file = safetensors_file(header, &[]);
    expect_error(
        "safetensors numel · bytes overflow",
        safetensors::parse("m.safetensors", &file),
        "`w`",
    );

    // Shapes whose element count overflows are typed errors, not panics or aborts.
    let dev = Device::cpu();
    let shape = Shape::from([1usize << 40, 1 << 40]);
    assert_eq!(shape.checked_numel(), None);
    assert!(matches!(
        Tensor::zeros(&dev, shape.clone()),
        Err(Error::OutOfMemory { .. })
    ));
    assert!(matches!(
        Tensor::from_vec(&dev, vec![0f32; 4], shape),
        Err(Error::DataLength { .. })
    ));
    assert_eq!(DType::Q8_0.storage_len(usize::MAX - 31, 32), None);
}

/// Counts the bytes each thread allocates, so a test can see what parsing costs.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + new_size));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocated() -> usize {
    ALLOCATED.with(Cell::get)
}

#[test]
fn gguf_metadata_takes_about_its_file_size_in_memory() {
    // A GGUF file with no tensors and one metadata array of n u8, and one of n short strings.
    let n = 1 << 20;
    let mut file = b"GGUF".to_vec();
    file.extend_from_slice(&3u32.to_le_bytes());
    file.extend_from_slice(&0u64.to_le_bytes());
    file.extend_from_slice(&2u64.to_le_bytes());
    let key = |file: &mut Vec<u8>, k: &str| {
        file.extend_from_slice(&(k.len() as u64).to_le_bytes());
        file.extend_from_slice(k.as_bytes());
        file.extend_from_slice(&9u32.to_le_bytes());
    };
    key(&mut file, "bytes");
    file.extend_from_slice(&0u32.to_le_bytes());
    file.extend_from_slice(&(n as u64).to_le_bytes());
    file.extend(std::iter::repeat_n(7u8, n));
    key(&mut file, "strings");
    file.extend_from_slice(&8u32.to_le_bytes());
    file.extend_from_slice(&(n as u64).to_le_bytes());
    for _ in 0..n {
        file.extend_from_slice(&1u64.to_le_bytes());
        file.push(b'x');
    }
    let before = allocated();
    let g = gguf::parse("arrays.gguf", &file).unwrap();
    let cost = allocated() - before;
    let bytes = g.metadata["bytes"].as_array().unwrap();
    let strings = g.metadata["strings"].as_array().unwrap();
    assert_eq!((bytes.len(), strings.len()), (n, n));
    assert_eq!(bytes.get(n - 1).and_then(|v| v.as_u64()), Some(7));
    assert_eq!(strings.get(n - 1).and_then(|v| v.as_str()), Some("x"));
    // Every allocation counted, growth included: at most twice the file.
    assert!(
        cost <= 2 * file.len(),
        "parsing {} bytes of metadata allocated {cost} bytes",
        file.len()
    );
}

#[test]
fn duplicates_are_errors() {
    let mut meta = tiny_meta(&[]);
    meta.push(("llama.embedding_length".into(), u(HIDDEN as u64)));
    let bytes = gguf_bytes(&meta, &tiny_tensors(1, 8, 8));
    expect_error(
        "repeated GGUF key",
        open_gguf(bytes),
        "llama.embedding_length",
    );

    let mut tensors = tiny_tensors(1, 8, 8);
    let again = tensors[1].clone();
    tensors.push(again);
    let bytes = gguf_bytes(&tiny_meta(&[]), &tensors);
    expect_error(
        "repeated GGUF tensor",
        open_gguf(bytes),
        "blk.0.attn_norm.weight",
    );

    let header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                    "w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let file = safetensors_file(header, &[0; 8]);
    expect_error(
        "repeated safetensors name",
        safetensors::parse("m.safetensors", &file),
        "`w` appears twice",
    );

    // The same tensor in two shards.
    let shard = safetensors_file(
        r#"{"model.norm.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    let shards = vec![
        ("a.safetensors".to_string(), FileBytes::Owned(shard.clone())),
        ("b.safetensors".to_string(), FileBytes::Owned(shard)),
    ];
    expect_error(
        "a tensor in two shards",
        ModelFiles::from_parts(&hf_config(), shards, None),
        "model.norm.weight",
    );
}

#[test]
fn bytes_must_be_what_their_type_says() {
    // f32 bytes declared as Q8_0: the next tensor's offset gives it away.
    let q = StoredDType::Packed(DType::Q8_0);
    let tensors: RawTensors = vec![
        ("a".into(), q, vec![1, 32], f32_bytes(32, 0)),
        ("b".into(), StoredDType::F32, vec![4], f32_bytes(4, 1)),
    ];
    let bytes = gguf_bytes(&[], &tensors);
    expect_error("f32 bytes as Q8_0", gguf::parse("t.gguf", &bytes), "`b`");
    // ... or, for the last tensor, the bytes left over.
    let tensors: RawTensors = vec![("a".into(), q, vec![1, 32], f32_bytes(32, 0))];
    let bytes = gguf_bytes(&[], &tensors);
    expect_error(
        "f32 bytes as Q8_0, last",
        gguf::parse("t.gguf", &bytes),
        "follow",
    );
    // safetensors: a gap between tensors, and bytes no tensor describes.
    let gap = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                  "b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let file = safetensors_file(gap, &[0; 12]);
    expect_error("safetensors gap", safetensors::parse("m", &file), "`b`");
    let extra = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let file = safetensors_file(extra, &[0; 12]);
    expect_error("safetensors tail", safetensors::parse("m", &file), "cover");
}

#[test]
fn values_are_never_truncated_and_errors_never_hidden() {
    // A token id beyond u32.
    let meta = tiny_meta(&[("tokenizer.ggml.bos_token_id", u((1 << 32) + 1))]);
    let bytes = gguf_bytes(&meta, &tiny_tensors(1, 8, 8));
    expect_error(
        "bos 2^32+1",
        open_gguf(bytes),
        "tokenizer.ggml.bos_token_id",
    );
    // A vocabulary that is not strings is an error, not "no tokenizer".
    let meta = tiny_meta(&[(
        "tokenizer.ggml.tokens",
        GgufValue::Array(GgufArray::u64s(0..VOCAB as u64)),
    )]);
    let bytes = gguf_bytes(&meta, &tiny_tensors(1, 8, 8));
    expect_error(
        "numbers as tokens",
        open_gguf(bytes),
        "tokenizer.ggml.tokens",
    );
}

#[test]
fn caches_are_sized_to_the_work() {
    // A context of 2^31 tokens: scoring three tokens must not ask for the whole context.
    let meta = tiny_meta(&[("llama.context_length", u(1 << 31))]);
    let model = load_gguf(gguf_bytes(&meta, &tiny_tensors(1, 8, 8))).unwrap();
    let logits = model.logits(&[1, 2, 3]).unwrap();
    assert_eq!(logits.dims(), &[3, VOCAB]);
    // Asking for the whole context says how much that is and how much there is.
    let err = model.new_cache(1 << 31).err().expect("too large a cache");
    match &err {
        Error::OutOfMemory {
            bytes, available, ..
        } => {
            assert_eq!(*bytes, (1u64 << 31) * 2 * 8 * 4);
            assert!(available.is_some(), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("are available"), "{err}");
    // A pool whose size overflows is refused the same way.
    let layout = webtensor_llm::CacheLayout::Static {
        max_batch: usize::MAX / 2,
        max_len: 64,
    };
    assert!(matches!(
        model.new_pool(layout),
        Err(Error::OutOfMemory { .. })
    ));
}

fn safetensors_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn hf_config() -> String {
    serde_json::json!({
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64
    })
    .to_string()
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("webtensor-hostile-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn index(dir: &Path, shard: &str) {
    let index = serde_json::json!({"weight_map": {"model.norm.weight": shard}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn shard_paths_stay_in_the_model_folder() {
    let root = temp_dir("shards");
    let model = root.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), hf_config()).unwrap();
    // A readable safetensors file outside the folder, which the refused paths lead to.
    let outside = root.join("outside.safetensors");
    let shard = safetensors_file(
        r#"{"model.norm.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    std::fs::write(&outside, &shard).unwrap();
    for name in ["../outside.safetensors", outside.to_str().unwrap()] {
        index(&model, name);
        expect_error(name, ModelFiles::open(&model), "shard path");
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&outside, model.join("link.safetensors")).unwrap();
        index(&model, "link.safetensors");
        expect_error(
            "a symbolic link out",
            ModelFiles::open(&model),
            "shard path",
        );
    }
    // A shard inside the folder, in a subfolder, is fine as far as the path goes.
    std::fs::create_dir_all(model.join("sub")).unwrap();
    std::fs::write(model.join("sub/x.safetensors"), &shard).unwrap();
    index(&model, "sub/x.safetensors");
    let err = ModelFiles::open(&model).err().map(|e| e.to_string());
    assert!(
        !err.as_deref().unwrap_or("").contains("shard path"),
        "{err:?}"
    );
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_model_larger_than_memory_suggests_resident_layers() {
    let bytes = gguf_bytes(
        &tiny_meta(&[("llama.block_count", u(3))]),
        &tiny_tensors(3, 8, 8),
    );
    let files = || open_gguf(bytes.clone()).unwrap();
    let limited = |bytes: u64| {
        Device::builder()
            .priority(vec![BackendKind::Cpu])
            .memory_limit(bytes)
            .build()
            .unwrap()
    };
    // Embedding and output 1,024 bytes (f32, counted twice), each layer 2,624: room for the
    // embedding, one streamed layer and one resident layer, not for three.
    let base = (VOCAB * HIDDEN * 4 * 2) as u64;
    let layer = ((HIDDEN * 2 + 64 * 4 + 128 * 3) * 4) as u64;
    let device = limited(base + 2 * layer + 100);
    let err = expect_error(
        "three layers in room for two",
        Llama::load(&device, files()),
        "--resident-layers 1",
    );
    assert!(err.contains("are available"), "{err}");
    // As suggested, it loads and gives the numbers of the fully resident model.
    let streamed = Llama::load_streaming(&device, files(), 1).unwrap();
    let resident = Llama::load(&Device::cpu(), files()).unwrap();
    let (a, b): (Vec<f32>, Vec<f32>) = (
        streamed.logits(&[1, 2, 3]).unwrap().to_vec().unwrap(),
        resident.logits(&[1, 2, 3]).unwrap().to_vec().unwrap(),
    );
    assert_eq!(a, b);
    // Too little even for the embedding.
    expect_error(
        "no room at all",
        Llama::load_streaming(&limited(100), files(), 0),
        "smaller or more quantized model",
    );
}

/// A weight beyond the wgpu device's largest buffer is an error naming it (lavapipe's limit is
/// 128 MiB: an f16 embedding of 2^22 + 1 rows of 8 becomes 128 MiB + 32 bytes as f32).
#[test]
fn a_weight_beyond_one_binding_is_read_in_row_ranges() {
    // Once refused with `WeightTooLarge`: the wgpu products and gathers now bind such a table
    // in row ranges (`native-tests/wgpu_split.rs` checks their values); only a tensor beyond
    // `max_buffer_size` (2 GiB on lavapipe, too large to build here) is still refused.
    let Some(device) = common::wgpu() else { return };
    let limit = device
        .info()
        .limits
        .iter()
        .find(|(name, _)| name == "max_storage_buffer_binding_size")
        .map(|(_, v)| *v)
        .unwrap();
    let rows = (limit as usize / (HIDDEN * 4)) + 1;
    if rows > 1 << 23 {
        eprintln!("skipping: a {limit}-byte binding limit needs too large a test model");
        return;
    }
    let mut tensors = tiny_tensors(1, 8, 8);
    tensors[0] = (
        "token_embd.weight".into(),
        StoredDType::F16,
        vec![rows, HIDDEN],
        vec![0; rows * HIDDEN * 2],
    );
    let meta = tiny_meta(&[("llama.vocab_size", u(rows as u64))]);
    let model = load_on(&device, gguf_bytes(&meta, &tensors)).unwrap();
    let last = (rows - 1) as u32;
    let logits: Vec<f32> = model.logits(&[1, last]).unwrap().to_vec().unwrap();
    assert_eq!(logits.len(), 2 * rows);
    assert!(logits.iter().all(|v| v.is_finite()));
}

fn load_on(device: &Device, bytes: Vec<u8>) -> Result<Llama, Error> {
    Llama::load(device, open_gguf(bytes)?)
}

/// A chat template is input from the model's files: one that loops, grows a string without
/// end or writes without end must stop with a typed error naming it and its bound, quickly,
/// without allocating more than its bounds allow. With a context of 4096 tokens the fuel is
/// 200,000 + 16 × 4096 = 265,536, and at most 64 bytes a fuel may be made: 17 MB.
#[test]
fn chat_templates_stay_within_bounds() {
    use webtensor::TemplateBound;
    use webtensor_llm::chat::render_template;
    use webtensor_llm::{ChatMessage, ChatOptions, ChatTemplate};
    let options = ChatOptions {
        add_generation_prompt: true,
        now: Some(0),
        context: 4096,
        enable_thinking: None,
    };
    let messages = [ChatMessage::new("user", "hi")];
    // (what, template, the bound it must hit: `None` for another error, such as minijinja's
    // own limits on ranges, recursion and nesting).
    let fuel = Some(TemplateBound::Fuel { fuel: 265_536 });
    let output = Some(TemplateBound::Output {
        bytes: 262_144,
        context: 4096,
        bytes_per_token: 64,
    });
    let double = |op: &str| {
        format!(
            "{{% set ns = namespace(s='ab') %}}{{% for i in range(40) %}}{{% set ns.s = ns.s \
             {op} ns.s %}}{{% endfor %}}{{{{ ns.s | length }}}}"
        )
    };
    let nested = format!("{{{{ {}1{} }}}}", "(".repeat(100_000), ")".repeat(100_000));
    let cases: Vec<(&str, String, Option<TemplateBound>)> = vec![
        ("a string doubled 40 times with ~", double("~"), fuel),
        ("a string doubled 40 times with +", double("+"), fuel),
        (
            "a string doubled by a recursive macro",
            "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s | length }}\
             {% endif %}{% endmacro %}{{ d('ab', 40) }}"
                .into(),
            fuel,
        ),
        (
            "a string grown by replace",
            "{% set ns = namespace(s='abcdefgh') %}{% for i in range(30) %}{% set ns.s = \
             ns.s.replace('a', ns.s) %}{% endfor %}{{ ns.s | length }}"
                .into(),
            fuel,
        ),
        ("'x' * 10^12", "{{ 'x' * 1000000000000 }}".into(), fuel),
        (
            "'ab' * 10^5 * 10^5",
            "{{ ('ab' * 100000) * 100000 }}".into(),
            fuel,
        ),
        (
            "a list repeated 10^5 times, joined",
            "{{ (range(100000) | list * 100000) | join(',') }}".into(),
            None,
        ),
        (
            "10,000 x 10,000 empty loops",
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}".into(),
            fuel,
        ),
        (
            "10^5 x 10^5 loops writing 1000 bytes each",
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 1000 }}\
             {% endfor %}{% endfor %}"
                .into(),
            output,
        ),
        (
            "tojson with an indent of 10^12",
            "{{ messages | tojson(indent=1000000000000) }}".into(),
            fuel,
        ),
        (
            "a format width of 10^9",
            "{{ '{:>1000000000}'.format(1) }}".into(),
            fuel,
        ),
        (
            "a printf width of 10^9",
            "{{ '%1000000000s' | format(1) }}".into(),
            None,
        ),
        (
            "indent by 10^9",
            "{{ 'a\nb' | indent(1000000000) }}".into(),
            None,
        ),
        (
            "strftime_now of a 10^6-field format",
            "{{ strftime_now('%B' * 1000000) }}".into(),
            None,
        ),
        (
            "endless macro recursion",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into(),
            None,
        ),
        (
            "a range of 10^9",
            "{{ range(1000000000) | list }}".into(),
            None,
        ),
        ("10^5 nested parentheses", nested, None),
    ];
    let mut report = Vec::new();
    for (what, text, bound) in cases {
        let template = ChatTemplate::new(text, format!("hostile: {what}"));
        let before = allocated();
        let start = std::time::Instant::now();
        let result = render_template(&template, &messages, &options, None, None);
        let seconds = start.elapsed().as_secs_f64();
        let bytes = allocated() - before;
        let err = match result {
            Ok(text) => panic!("{what}: rendered {} bytes", text.len()),
            Err(e) => e,
        };
        if let Some(bound) = bound {
            match &err {
                Error::TemplateLimit { template, bound: b } => {
                    assert_eq!(*b, bound, "{what}: {err}");
                    assert_eq!(template, &format!("hostile: {what}"));
                }
                other => panic!("{what}: {other}"),
            }
        }
        assert!(
            err.to_string().contains(&format!("hostile: {what}")),
            "{what}: {err}"
        );
        // Allocations over the whole render, growth included: the 17 MB the fuel allows,
        // several times over, far from the gigabytes these templates would make.
        assert!(bytes < 256 << 20, "{what}: allocated {bytes} bytes");
        report.push(format!(
            "{what}: {seconds:.3} s, {:.1} MB: {err}",
            bytes as f64 / 1e6
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// A `Split` pattern of a `tokenizer.json` is input too: one that backtracks without end
/// on a text stops at its bound of a million steps with an error naming it, not a hang.
#[test]
fn tokenizer_patterns_that_backtrack_without_end_are_refused() {
    use webtensor_llm::Tokenizer;
    const PATTERN: &str = "((a|a)*)(?!a)b";
    let file = serde_json::json!({
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated"},
        "decoder": {"type": "ByteLevel"},
    });
    let tokenizer = Tokenizer::from_json(&file.to_string(), "hostile/tokenizer.json").unwrap();
    // Short runs end within the bound: (a|a)* has 2^n ways through n letters, each tried
    // before the look-ahead gives up.
    assert_eq!(tokenizer.encode("aab").unwrap(), [0, 0, 1]);
    let start = std::time::Instant::now();
    let err = tokenizer.encode(&"a".repeat(64)).unwrap_err();
    let seconds = start.elapsed().as_secs_f64();
    match &err {
        Error::PatternLimit {
            pattern,
            limit: 1_000_000,
        } => assert_eq!(pattern, PATTERN),
        other => panic!("{other}"),
    }
    eprintln!("{seconds:.3} s: {err}");
    assert!(seconds < 10.0, "{seconds} s");
}
