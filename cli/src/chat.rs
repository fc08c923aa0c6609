//! `webtensor chat` and `webtensor generate --chat`: conversations rendered with the model's
//! chat template (or `--chat-template FILE`, or ChatML for a model without one), replies
//! streamed as they are generated and ended at the end-of-turn token.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use webtensor::Error;
use webtensor_llm::{ChatMessage, ChatTemplate, Llama, PromptCache, Sampling, Tokenizer};

use super::{load_with_tokenizer, report, ModelArgs};

/// Opens the model and its tokenizer for chat (here and in `serve`): with `template` (a file,
/// read and parsed before the model loads) in place of the model's own template; a model
/// left without one renders ChatML, which one line on standard error says.
pub fn load(args: &ModelArgs, template: Option<&Path>) -> Result<(Llama, Tokenizer), Error> {
    let template = template.map(ChatTemplate::from_file).transpose()?;
    let (llama, mut tokenizer) = load_with_tokenizer(args)?;
    match template {
        Some(t) => tokenizer.set_chat_template(Some(t), None, None),
        None if tokenizer.chat_template().is_none() => eprintln!(
            "the model has no chat template: chat uses ChatML (<|im_start|>role ... \
             <|im_end|>); --chat-template FILE gives another"
        ),
        None => {}
    }
    Ok((llama, tokenizer))
}

/// Generates the assistant's reply to `messages`, printing it as it comes; returns its text.
/// `cache` keeps the conversation's keys and values from turn to turn.
fn reply(
    llama: &Llama,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    cache: &mut PromptCache,
    max_tokens: usize,
    sampling: Sampling,
) -> Result<String, Error> {
    let mut out = std::io::stdout();
    let mut text = String::new();
    let print = |piece: &str| {
        text.push_str(piece);
        print!("{piece}");
        let _ = out.flush();
    };
    let stats = webtensor_llm::generate_chat(
        llama, tokenizer, messages, cache, max_tokens, sampling, print,
    )?;
    println!();
    report(&stats);
    Ok(text.trim().to_string())
}

/// One exchange: an optional system message, the user's, and the reply.
pub fn once(
    args: &ModelArgs,
    template: Option<&Path>,
    system: Option<&str>,
    user: &str,
    max_tokens: usize,
    sampling: Sampling,
) -> Result<(), Error> {
    let (llama, tokenizer) = load(args, template)?;
    let mut messages: Vec<ChatMessage> = system
        .map(|s| ChatMessage::new("system", s))
        .into_iter()
        .collect();
    messages.push(ChatMessage::new("user", user));
    let mut cache = PromptCache::new();
    reply(
        &llama, &tokenizer, &messages, &mut cache, max_tokens, sampling,
    )?;
    Ok(())
}

/// The conversation loop over standard input.
pub fn interactive(
    args: &ModelArgs,
    template: Option<&Path>,
    system: Option<&str>,
    max_tokens: usize,
    sampling: Sampling,
) -> Result<(), Error> {
    let (llama, tokenizer) = load(args, template)?;
    let start: Vec<ChatMessage> = system
        .map(|s| ChatMessage::new("system", s))
        .into_iter()
        .collect();
    let mut messages = start.clone();
    let mut cache = PromptCache::new();
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
        match reply(
            &llama, &tokenizer, &messages, &mut cache, max_tokens, sampling,
        ) {
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
