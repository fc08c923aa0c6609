//! Chat templates rendered by webtensor (minijinja) against transformers' `apply_chat_template`
//! on the same real templates and conversations (`fixtures/tokenizers/chat_templates.json`,
//! written by scripts/tokenizer_fixtures.py: Llama 3.1/3.2, Qwen2.5, Qwen3, Mistral Nemo,
//! Gemma 2, Gemma 3, Phi-3.5, SmolLM3), and a chat turn through the engine.

mod common;

use webtensor_llm::chat::render_template;
use webtensor_llm::{ChatMessage, ChatOptions, ChatTemplate};

fn fixture() -> serde_json::Value {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
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
        let template = ChatTemplate::new(t["template"].as_str().unwrap(), name.as_str());
        let cases = t["cases"].as_array().unwrap();
        let mut exact = 0;
        for case in cases {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            // The smallest context of these models (Phi-3.5's is 128k, Llama 3.1's too).
            let options = ChatOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                now: Some(now),
                context: 4096,
                enable_thinking: case["enable_thinking"].as_bool(),
            };
            let got = render_template(&template, &messages, &options, bos, eos);
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

fn run_cli(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_webtensor"))
        .args(args)
        .env_remove("WEBTENSOR_BACKEND")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn chat_cli_takes_turns_with_the_template() {
    let dir = common::chat_model_dir("chat-model");
    let model = dir.to_str().unwrap();
    let files = webtensor_llm::ModelFiles::open(&dir).unwrap();
    let tokenizer = files.tokenizer.unwrap();
    let first = [ChatMessage::new("user", "In the beginning")];
    let options = ChatOptions {
        add_generation_prompt: true,
        now: None,
        context: 256,
        enable_thinking: None,
    };
    let rendered = tokenizer.render_chat(&first, &options).unwrap();
    assert_eq!(rendered, "<s>user: In the beginning</s>\n<s>assistant:");
    let ids = tokenizer.encode_with_special(&rendered).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 0).count(), 2, "{ids:?}");
    assert!(tokenizer.is_stop(1));

    let too_long = "and ".repeat(400);
    let (ok, out, err) = run_cli(
        &[
            "chat",
            "--model",
            model,
            "--backend",
            "cpu",
            "--max-tokens",
            "6",
        ],
        &format!("In the beginning\n{too_long}\n/reset\nAnd God said\n/exit\n"),
    );
    assert!(ok, "{err}");
    // The turn too long for the context is reported and the conversation goes on.
    assert!(err.contains("KV cache is full"), "{err}");
    assert!(out.starts_with("> In the beginning\n"), "{out}");
    assert!(out.contains("> And God said\n"), "{out}");
    let prompts: Vec<&str> = err.lines().filter(|l| l.starts_with("prompt:")).collect();
    assert_eq!(prompts.len(), 2, "{err}");
    assert!(
        prompts[0].starts_with(&format!("prompt: {} tokens", ids.len())),
        "{err}"
    );

    let (ok, out, err) = run_cli(
        &[
            "generate",
            "--chat",
            "--model",
            model,
            "--backend",
            "cpu",
            "--max-tokens",
            "4",
            "--prompt",
            "In the beginning",
        ],
        "",
    );
    assert!(ok && err.contains("tokens/s"), "{out}{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The prompt's token count in a CLI report (`prompt: N tokens, ...`).
fn prompt_tokens(err: &str) -> usize {
    err.split("prompt: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt count in {err}"))
}

#[test]
fn a_model_without_a_template_chats_in_chatml() {
    // The built-in model has no chat template.
    let (ok, out, err) = run_cli(
        &["chat", "--backend", "cpu", "--max-tokens", "3"],
        "In the beginning\nAnd God said\n",
    );
    assert!(ok, "{out}{err}");
    assert!(err.contains("no chat template: chat uses ChatML"), "{err}");
    let chatml = "<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\n";
    let tokenizer = webtensor_llm::builtin::files().unwrap().tokenizer.unwrap();
    let ids = tokenizer.encode_with_special(chatml).unwrap();
    assert_eq!(prompt_tokens(&err), ids.len(), "{err}");
    // The second turn runs only what follows the first turn's prompt and reply: the cache
    // keeps the prompt and the two replied tokens that were fed back.
    let second = err
        .lines()
        .filter(|l| l.starts_with("prompt:"))
        .nth(1)
        .unwrap_or_else(|| panic!("no second turn in {err}"));
    assert!(
        second.contains(&format!("({} kept from the last turn)", ids.len() + 2)),
        "{err}"
    );
}

#[test]
fn chat_template_files_replace_the_models() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat-template-files");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("plain.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}And{% endif %}",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let args = [
        "generate",
        "--chat",
        "--backend",
        "cpu",
        "--max-tokens",
        "2",
    ];
    let (ok, out, err) = run_cli(
        &[
            &args[..],
            &["--chat-template", path, "--prompt", "In the beginning"],
        ]
        .concat(),
        "",
    );
    assert!(ok, "{out}{err}");
    assert!(!err.contains("ChatML"), "{err}");
    let tokenizer = webtensor_llm::builtin::files().unwrap().tokenizer.unwrap();
    let ids = tokenizer
        .encode_with_special("In the beginning\nAnd")
        .unwrap();
    assert_eq!(prompt_tokens(&err), ids.len(), "{err}");

    // A file that is missing, or not a template: one error line naming it, before the load.
    let missing = dir.join("missing.jinja");
    let (ok, _, err) = run_cli(
        &[&args[..], &["--chat-template", missing.to_str().unwrap()]].concat(),
        "",
    );
    assert!(
        !ok && err.contains("missing.jinja") && err.starts_with("error:"),
        "{err}"
    );
    let broken = dir.join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}{{ m.content }").unwrap();
    let (ok, _, err) = run_cli(
        &[&args[..], &["--chat-template", broken.to_str().unwrap()]].concat(),
        "",
    );
    assert!(
        !ok && err.contains("broken.jinja") && err.contains("not a chat template"),
        "{err}"
    );
    assert!(!err.contains("layers"), "the model was loaded first: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
