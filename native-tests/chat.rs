//! Chat templates rendered by webtensor (minijinja) against transformers' `apply_chat_template`
//! on the same real templates and conversations (`fixtures/tokenizers/chat_templates.json`,
//! written by scripts/tokenizer_fixtures.py: Llama 3.1/3.2, Qwen2.5, Qwen3, Mistral Nemo,
//! Gemma 2, Phi-3.5, SmolLM3), and a chat turn through the engine.

use webtensor::model::chat::render_template;
use webtensor::model::{ChatMessage, ChatOptions};

fn fixture() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("native-tests/fixtures/tokenizers/chat_templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn templates_render_like_transformers() {
    let f = fixture();
    let now = f["now"].as_i64().unwrap();
    let (bos, eos) = (f["bos_token"].as_str(), f["eos_token"].as_str());
    let mut failures = Vec::new();
    let mut total = 0;
    println!("| template | exact / cases |");
    println!("| --- | --- |");
    for (name, t) in f["templates"].as_object().unwrap() {
        let template = t["template"].as_str().unwrap();
        let cases = t["cases"].as_array().unwrap();
        let mut exact = 0;
        for case in cases {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            let options = ChatOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                now: Some(now),
            };
            let got = render_template(template, &messages, &options, bos, eos);
            let ok = match (&got, case["text"].as_str(), case["error"].as_str()) {
                (Ok(text), Some(want), _) => text == want,
                (Err(e), None, Some(want)) => e.to_string().contains(want),
                _ => false,
            };
            if ok {
                exact += 1;
            } else {
                failures.push(format!("{name}: {case}\n  got {got:?}"));
            }
        }
        total += cases.len();
        println!("| {name} | {exact} / {} |", cases.len());
    }
    assert!(total >= 24, "{total} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
