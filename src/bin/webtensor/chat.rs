//! `webtensor chat` and `webtensor generate --chat`: conversations rendered with the model's
//! chat template, replies streamed as they are generated and ended at the end-of-turn token.

use std::io::{BufRead, IsTerminal, Write};

use webtensor::model::{self, ChatMessage, Llama, Sampling, Tokenizer};
use webtensor::Error;

use super::{load_with_tokenizer, report, ModelArgs};

/// Generates the assistant's reply to `messages`, printing it as it comes; returns its text.
fn reply(
    llama: &Llama,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    max_tokens: usize,
    sampling: Sampling,
) -> Result<String, Error> {
    let mut out = std::io::stdout();
    let mut text = String::new();
    let stats = model::generate_chat(llama, tokenizer, messages, max_tokens, sampling, |piece| {
        text.push_str(piece);
        print!("{piece}");
        let _ = out.flush();
    })?;
    println!();
    report(&stats);
    Ok(text.trim().to_string())
}

/// One exchange: an optional system message, the user's, and the reply.
pub fn once(
    args: &ModelArgs,
    system: Option<&str>,
    user: &str,
    max_tokens: usize,
    sampling: Sampling,
) -> Result<(), Error> {
    let (llama, tokenizer) = load_with_tokenizer(args)?;
    let mut messages: Vec<ChatMessage> = system
        .map(|s| ChatMessage::new("system", s))
        .into_iter()
        .collect();
    messages.push(ChatMessage::new("user", user));
    reply(&llama, &tokenizer, &messages, max_tokens, sampling)?;
    Ok(())
}

/// The conversation loop over standard input.
pub fn interactive(
    args: &ModelArgs,
    system: Option<&str>,
    max_tokens: usize,
    sampling: Sampling,
) -> Result<(), Error> {
    let (llama, tokenizer) = load_with_tokenizer(args)?;
    if tokenizer.chat_template().is_none() {
        return Err(Error::ModelFile {
            path: args
                .model
                .as_ref()
                .map_or("the built-in model".into(), |p| p.display().to_string()),
            reason: "the model has no chat template (tokenizer_config.json `chat_template`, \
                     chat_template.jinja, or GGUF `tokenizer.chat_template`); use \
                     `webtensor generate` to continue a text"
                .into(),
        });
    }
    let start: Vec<ChatMessage> = system
        .map(|s| ChatMessage::new("system", s))
        .into_iter()
        .collect();
    let mut messages = start.clone();
    eprintln!("chat: type a message and press Enter; /reset starts over, /exit ends");
    let stdin = std::io::stdin();
    // Typed input is on the screen already; piped input is echoed so the output reads as a
    // transcript.
    let echo = !stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    loop {
        print!("> ");
        let _ = std::io::stdout().flush();
        let Some(line) = lines.next() else {
            println!();
            return Ok(());
        };
        let line = line.map_err(|source| Error::Io {
            path: "standard input".into(),
            source,
        })?;
        if echo {
            println!("{line}");
        }
        match line.trim() {
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                messages = start.clone();
                continue;
            }
            "" => continue,
            _ => {}
        }
        messages.push(ChatMessage::new("user", &line));
        match reply(&llama, &tokenizer, &messages, max_tokens, sampling) {
            Ok(answer) => messages.push(ChatMessage::new("assistant", &answer)),
            // A turn the model cannot take (the context is full, the template refuses the
            // conversation) is reported and undone; the conversation goes on.
            Err(e) => {
                eprintln!("error: {e} (/reset starts a new conversation)");
                messages.pop();
            }
        }
    }
}
