//! Chat: a conversation rendered with the model's own chat template (Jinja, the
//! `chat_template` of `tokenizer_config.json` or GGUF's `tokenizer.chat_template`), the way
//! transformers' `apply_chat_template` renders it: `trim_blocks` and `lstrip_blocks`, loop
//! controls, `raise_exception`, a Python-style `tojson`, `strftime_now`, Python's string
//! methods (`.strip()`, `.startswith()`, ...), and `bos_token`/`eos_token`. A model without a
//! template is rendered with ChatML ([`ChatTemplate::chatml`]).
//!
//! A template is input from a file, like the tensors, so a render is bounded
//! ([`RenderLimits`]): minijinja's fuel bounds its instructions and the bytes it makes (which
//! bounds its memory), and its output may not exceed what the context could hold. Past
//! either it is an [`Error::TemplateLimit`] naming the template and the bound. The two things
//! a template can do beyond minijinja's fuel end the process instead; a program that must
//! outlive them renders elsewhere through a [`TemplateRenderer`].

use std::io::Write;

use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, ErrorKind, State, Value};
use serde::{Deserialize, Serialize};

use super::Tokenizer;
use webtensor::error::{Error, Result, TemplateBound};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may know others).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How a conversation is rendered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChatOptions {
    /// End with the header of the assistant's next turn, so the model writes it.
    pub add_generation_prompt: bool,
    /// The time `strftime_now` formats, in seconds since 1970 (default: now). Templates such
    /// as Llama 3.2's put today's date in the system prompt.
    pub now: Option<i64>,
    /// The context the rendered prompt must fit, in tokens: it sizes the render's bounds
    /// ([`RenderLimits::for_context`]).
    pub context: usize,
    /// The template's `enable_thinking` (SmolLM3, Qwen3: whether the model reasons before it
    /// answers), as `apply_chat_template(..., enable_thinking=...)` passes it; `None` leaves it
    /// undefined, so the template's own default holds.
    pub enable_thinking: Option<bool>,
}

/// A chat template and where it came from, which its errors name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTemplate {
    /// The Jinja source.
    pub text: String,
    /// Where it came from: `tokenizer_config.json`'s `chat_template`, `chat_template.jinja`,
    /// a GGUF file's `tokenizer.chat_template`, a `--chat-template` file, or ChatML.
    pub origin: String,
}

/// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` for each message, then
/// `<|im_start|>assistant\n` for the reply.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                      {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The most bytes a template file may have: real templates have a few to a few tens of
/// kilobytes, and reading a file without end (`/dev/zero`) must stop.
#[cfg(not(target_arch = "wasm32"))]
const MAX_TEMPLATE_FILE_BYTES: u64 = 1 << 20;

impl ChatTemplate {
    /// A template from `origin`.
    pub fn new(text: impl Into<String>, origin: impl Into<String>) -> ChatTemplate {
        ChatTemplate {
            text: text.into(),
            origin: origin.into(),
        }
    }

    /// ChatML, the template of models whose files have none: the most common chat format of
    /// open models, so an instruction-tuned model without a template often knows it.
    pub fn chatml() -> ChatTemplate {
        ChatTemplate::new(
            CHATML,
            "ChatML (webtensor's default for models without a chat template)",
        )
    }

    /// Reads a template file (`--chat-template FILE`) and checks that it parses: an
    /// unreadable file is an [`Error::Io`], one that is not a template an
    /// [`Error::ModelFile`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_file(path: &std::path::Path) -> Result<ChatTemplate> {
        use std::io::Read;
        let name = path.display().to_string();
        let io = |source| Error::Io {
            path: name.clone(),
            source,
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_TEMPLATE_FILE_BYTES + 1).read_to_end(&mut bytes))
            .map_err(io)?;
        if bytes.len() as u64 > MAX_TEMPLATE_FILE_BYTES {
            return Err(Error::model_file(
                &name,
                format!(
                    "a chat template of more than {MAX_TEMPLATE_FILE_BYTES} bytes; templates \
                     have a few kilobytes"
                ),
            ));
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| Error::model_file(&name, format!("a chat template not in UTF-8: {e}")))?;
        let mut env = environment(0);
        env.add_template("chat", &text).map_err(|e| {
            Error::model_file(
                &name,
                format!("not a chat template webtensor can render: {}", reason(&e)),
            )
        })?;
        Ok(ChatTemplate::new(text, name))
    }
}

/// The bounds of one render, sized by the context the rendered prompt must fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// minijinja's fuel: one per instruction and one per 64 bytes of text or list made,
    /// visited or written. Every byte a render makes is charged, so it may make at most 64
    /// bytes per fuel in all, however it makes them: fuel bounds memory as well as time.
    pub fuel: u64,
    /// The most bytes the render may write.
    pub output_bytes: usize,
}

impl RenderLimits {
    /// Bytes of rendered text per token of context. Text averages 3 to 5 bytes a token; a
    /// prompt of more than 64 a token would need tokens longer than any real text has, and
    /// could not fit the context anyway.
    pub const BYTES_PER_TOKEN: usize = 64;
    /// Fuel every render gets: real templates take a few hundred instructions per message
    /// and a few thousand to start (Llama 3.1's with tools).
    pub const BASE_FUEL: u64 = 200_000;
    /// Fuel per token of context: a message is at least a few tokens (its header), so this
    /// pays for a context full of short messages, and the bytes of a full context several
    /// times over.
    pub const FUEL_PER_TOKEN: u64 = 16;

    /// The bounds for a context of `tokens`: fuel [`BASE_FUEL`](Self::BASE_FUEL) +
    /// [`FUEL_PER_TOKEN`](Self::FUEL_PER_TOKEN) per token (at most 64 bytes a fuel: 13 MB
    /// and 1 KB a token), output [`BYTES_PER_TOKEN`](Self::BYTES_PER_TOKEN) per token.
    pub fn for_context(tokens: usize) -> RenderLimits {
        RenderLimits {
            fuel: Self::BASE_FUEL
                .saturating_add(Self::FUEL_PER_TOKEN.saturating_mul(tokens as u64)),
            output_bytes: tokens.saturating_mul(Self::BYTES_PER_TOKEN),
        }
    }
}

/// A minijinja error and the errors under it, as one line.
fn reason(e: &minijinja::Error) -> String {
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        reason.push_str(&format!(": {s}"));
        source = s.source();
    }
    reason
}

/// Whether `e`, or an error under it, is minijinja running out of fuel.
fn out_of_fuel(e: &minijinja::Error) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(m) = err.downcast_ref::<minijinja::Error>() {
            if m.kind() == ErrorKind::OutOfFuel {
                return true;
            }
        }
        next = err.source();
    }
    false
}

/// The output of a render, refusing to grow past `limit` bytes.
struct BoundedOutput {
    bytes: Vec<u8>,
    limit: usize,
    /// A write would have passed the limit.
    over: bool,
}

impl Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.limit {
            self.over = true;
            return Err(std::io::Error::other("the output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The seconds since 1970 now.
fn now_secs() -> i64 {
    #[cfg(target_arch = "wasm32")]
    {
        (js_sys::Date::now() / 1000.0) as i64
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    }
}

/// Formats a UTC time with the C `strftime` fields templates use (`%d %b %Y`, `%Y-%m-%d`,
/// `%B`, `%H:%M:%S`, `%A`).
fn strftime(format: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "`
/// separators on one line, or `","` and one item a line with an indent. Fails (`Err(())`)
/// rather than write more than `budget` bytes: an indent is a number from the template, and
/// each line repeats it.
fn python_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
    budget: usize,
) -> std::result::Result<(), ()> {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            let spaces = n.saturating_mul(depth);
            if out.len().saturating_add(spaces) >= budget {
                return Err(());
            }
            out.push('\n');
            out.push_str(&" ".repeat(spaces));
        }
        Ok(())
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1)?;
                python_json(item, indent, depth + 1, out, budget)?;
            }
            newline(out, depth)?;
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1)?;
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                python_json(item, indent, depth + 1, out, budget)?;
            }
            newline(out, depth)?;
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
    if out.len() > budget {
        return Err(());
    }
    Ok(())
}

/// The `tojson` filter as transformers defines it (Python's `json.dumps`, not HTML-escaped).
/// Its text may be no longer than the render's remaining fuel pays for (64 bytes a fuel).
fn tojson(
    state: &State,
    value: Value,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    python_json(&json, indent, 0, &mut out, room(state))
        .map_err(|()| minijinja::Error::from(ErrorKind::OutOfFuel))?;
    Ok(Value::from_safe_string(out))
}

/// The bytes the render's remaining fuel pays for (64 a fuel).
fn room(state: &State) -> usize {
    state.fuel_levels().map_or(usize::MAX, |(_, remaining)| {
        usize::try_from(remaining.saturating_mul(64)).unwrap_or(usize::MAX)
    })
}

/// The sum of the numbers written in the replacement fields (`{...}`) of a `str.format`
/// string: at least the bytes its widths and precisions pad to.
fn field_numbers(format: &str) -> usize {
    let (mut total, mut number, mut depth) = (0usize, 0usize, 0usize);
    for c in format.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        match c.to_digit(10) {
            Some(d) if depth > 0 => number = number.saturating_mul(10).saturating_add(d as usize),
            _ => {
                total = total.saturating_add(number);
                number = 0;
            }
        }
    }
    total.saturating_add(number)
}

/// Python's methods of strings, lists and dicts (minijinja-contrib's pycompat), with
/// `str.format`'s widths and precisions paid for before they are written: pycompat pads to
/// any width it is given (`'{:>1000000000}'.format(1)` would be a gigabyte).
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if let (Some(format), "format") = (value.as_str(), method) {
        if field_numbers(format) >= room(state) {
            return Err(minijinja::Error::from(ErrorKind::OutOfFuel));
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// An environment that renders as transformers does (see the module's documentation), with
/// `strftime_now` formatting `now`. No fuel is set: [`render_template`] sets it.
fn environment<'s>(now: i64) -> Environment<'s> {
    let mut env = Environment::new();
    // `SyntaxConfig::builder().build()` only fails on custom delimiters, and these are the
    // default ones; were it ever to fail, the default syntax would only keep the blank lines
    // around block tags.
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_unknown_method_callback(python_method);
    env.add_filter("tojson", tojson);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function("strftime_now", move |format: String| strftime(&format, now));
    env
}

/// Renders `messages` with `template`; `bos`/`eos` are the texts of those tokens. The render
/// is bounded by [`RenderLimits::for_context`] of `options.context`: past its fuel or its
/// output limit it stops with an [`Error::TemplateLimit`]; a template that does not parse or
/// fails otherwise (`raise_exception`, an unknown filter) is an [`Error::InvalidArgument`]
/// naming it.
pub fn render_template(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    options: &ChatOptions,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String> {
    let limits = RenderLimits::for_context(options.context);
    let failed = |e: &minijinja::Error| {
        Error::invalid(
            "chat",
            format!(
                "the chat template from {} failed: {}",
                template.origin,
                reason(e)
            ),
        )
    };
    let mut env = environment(options.now.unwrap_or_else(now_secs));
    env.set_fuel(Some(limits.fuel));
    env.add_template("chat", &template.text)
        .map_err(|e| failed(&e))?;
    let context = minijinja::context! {
        messages => Value::from(Serde(messages)),
        add_generation_prompt => options.add_generation_prompt,
        enable_thinking => options.enable_thinking.map_or(Value::UNDEFINED, Value::from),
        bos_token => bos,
        eos_token => eos,
    };
    let mut out = BoundedOutput {
        bytes: Vec::new(),
        limit: limits.output_bytes,
        over: false,
    };
    let rendered = env
        .get_template("chat")
        .and_then(|t| t.render_captured_to(context, &mut out).map(drop));
    let limit = |bound| Error::TemplateLimit {
        template: template.origin.clone(),
        bound,
    };
    match rendered {
        Ok(()) => String::from_utf8(out.bytes).map_err(|e| {
            Error::invalid(
                "chat",
                format!(
                    "the chat template from {} wrote bytes that are not UTF-8: {e}",
                    template.origin
                ),
            )
        }),
        Err(_) if out.over => Err(limit(TemplateBound::Output {
            bytes: limits.output_bytes,
            context: options.context,
            bytes_per_token: RenderLimits::BYTES_PER_TOKEN,
        })),
        Err(e) if out_of_fuel(&e) => Err(limit(TemplateBound::Fuel { fuel: limits.fuel })),
        Err(e) => Err(failed(&e)),
    }
}

/// One render of a chat template, owned: what [`render_template`] takes, in a form that can
/// be handed to a [`TemplateRenderer`] elsewhere (another thread, another process).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RenderRequest {
    pub template: ChatTemplate,
    pub messages: Vec<ChatMessage>,
    pub options: ChatOptions,
    /// The text of the BOS token, as the template's `bos_token`.
    pub bos: Option<String>,
    /// The text of the EOS token, as the template's `eos_token`.
    pub eos: Option<String>,
}

impl RenderRequest {
    /// Renders it here, with [`render_template`].
    pub fn render(&self) -> Result<String> {
        render_template(
            &self.template,
            &self.messages,
            &self.options,
            self.bos.as_deref(),
            self.eos.as_deref(),
        )
    }
}

/// Renders chat templates somewhere other than the calling thread.
///
/// [`RenderLimits`] bound what minijinja charges fuel for, but two things in minijinja 3.1
/// escape its fuel and end the whole process: a list doubled with `+` more than 32 times
/// (its concatenation is made without a charge) and a namespace stored into itself, then
/// printed (the stack overflows). A program that must outlive any template a model file
/// brings, such as a server, installs a renderer that runs the render in a process of its own
/// ([`Tokenizer::set_template_renderer`]); the `webtensor` command does. Without one, a
/// [`Tokenizer`] renders on the calling thread.
pub trait TemplateRenderer: Send + Sync + std::fmt::Debug {
    /// The rendered text, or the error [`render_template`] would give, or
    /// [`Error::TemplateAborted`] when the render ended the process it ran in.
    fn render(&self, request: RenderRequest) -> Result<String>;
}

impl Tokenizer {
    /// The template [`render_chat`](Tokenizer::render_chat) uses: the model's own
    /// ([`chat_template`](Tokenizer::chat_template)), or ChatML when its files have none.
    pub fn chat_template_or_chatml(&self) -> &ChatTemplate {
        static CHATML: std::sync::OnceLock<ChatTemplate> = std::sync::OnceLock::new();
        self.chat_template()
            .unwrap_or_else(|| CHATML.get_or_init(ChatTemplate::chatml))
    }

    /// Renders a conversation with the model's chat template (ChatML for a model without
    /// one), ready for [`encode_with_special`](Tokenizer::encode_with_special) (the template
    /// writes the BOS token itself where the model wants one); bounded as
    /// [`render_template`] says. It renders on the calling thread, or where the
    /// [`TemplateRenderer`] set with [`set_template_renderer`](Tokenizer::set_template_renderer)
    /// renders.
    pub fn render_chat(&self, messages: &[ChatMessage], options: &ChatOptions) -> Result<String> {
        let (bos, eos) = self.special_texts();
        let template = self.chat_template_or_chatml();
        match self.template_renderer() {
            None => render_template(template, messages, options, bos, eos),
            Some(renderer) => renderer.render(RenderRequest {
                template: template.clone(),
                messages: messages.to_vec(),
                options: options.clone(),
                bos: bos.map(str::to_string),
                eos: eos.map(str::to_string),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_like_strftime() {
        // 2024-07-26 12:34:56 UTC, a Friday.
        let t = 1_721_997_296;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %B", t),
            "2024-07-26 12:34:56 Friday July"
        );
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
    }

    #[test]
    fn tojson_like_python() {
        let v = serde_json::json!({"a": [1, "é"], "b": {}});
        let mut s = String::new();
        python_json(&v, None, 0, &mut s, usize::MAX).unwrap();
        assert_eq!(s, r#"{"a": [1, "é"], "b": {}}"#);
        let mut s = String::new();
        python_json(&v, Some(2), 0, &mut s, usize::MAX).unwrap();
        assert_eq!(s, "{\n  \"a\": [\n    1,\n    \"é\"\n  ],\n  \"b\": {}\n}");
        // The same with room for 20 bytes stops before the first indented line past them.
        let mut s = String::new();
        assert!(python_json(&v, Some(2), 0, &mut s, 20).is_err());
        assert!(s.len() <= 20, "{s:?}");
    }

    fn options(context: usize) -> ChatOptions {
        ChatOptions {
            add_generation_prompt: true,
            now: Some(0),
            context,
            enable_thinking: None,
        }
    }

    #[test]
    fn renders_and_raises() {
        let template = ChatTemplate::new("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}\n<{{ m.role }}>{{ m['content'].strip() }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}", "test.jinja");
        let msgs = [
            ChatMessage::new("user", " hi "),
            ChatMessage::new("assistant", "yo"),
        ];
        let out = render_template(&template, &msgs, &options(64), Some("<s>"), None).unwrap();
        assert_eq!(out, "<s><user>hi<assistant>yo<assistant>");
        let err = render_template(
            &template,
            &[ChatMessage::new("system", "x")],
            &options(64),
            None,
            None,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("no system") && text.contains("test.jinja"),
            "{err}"
        );
    }

    #[test]
    fn chatml_for_models_without_a_template() {
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        let out = render_template(&ChatTemplate::chatml(), &msgs, &options(64), None, None);
        assert_eq!(
            out.unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    /// The output may be 64 bytes per token of the context: 1024 for 16 tokens.
    #[test]
    fn output_is_bounded_by_the_context() {
        let write = |n: usize| ChatTemplate::new(format!("{{{{ 'x' * {n} }}}}"), "writer.jinja");
        let fits = render_template(&write(1024), &[], &options(16), None, None);
        assert_eq!(fits.unwrap().len(), 1024);
        let err = render_template(&write(1025), &[], &options(16), None, None).unwrap_err();
        match &err {
            Error::TemplateLimit {
                template,
                bound:
                    TemplateBound::Output {
                        bytes: 1024,
                        context: 16,
                        ..
                    },
            } => assert_eq!(template, "writer.jinja"),
            other => panic!("{other}"),
        }
        // Written piece by piece in a loop, the same.
        let looped = ChatTemplate::new("{% for i in range(2000) %}x{% endfor %}", "loop.jinja");
        let err = render_template(&looped, &[], &options(16), None, None).unwrap_err();
        assert!(
            matches!(
                err,
                Error::TemplateLimit {
                    bound: TemplateBound::Output { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    /// Fuel is 200,000 and 16 per token: 200,256 for 16 tokens.
    #[test]
    fn work_is_bounded_by_fuel() {
        let spin = ChatTemplate::new(
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            "spin.jinja",
        );
        let err = render_template(&spin, &[], &options(16), None, None).unwrap_err();
        match &err {
            Error::TemplateLimit {
                template,
                bound: TemplateBound::Fuel { fuel: 200_256 },
            } => assert_eq!(template, "spin.jinja"),
            other => panic!("{other}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("spin.jinja") && text.contains("200256 fuel"),
            "{text}"
        );
        // A huge indent in tojson is refused before its lines are written.
        let indent = ChatTemplate::new(
            "{{ [[1, 2], [3]] | tojson(indent=1000000000000) }}",
            "i.jinja",
        );
        let err = render_template(&indent, &[], &options(16), None, None).unwrap_err();
        assert!(
            matches!(
                err,
                Error::TemplateLimit {
                    bound: TemplateBound::Fuel { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn format_widths_are_paid_for() {
        assert_eq!(field_numbers("{:>10} {0:.3f} {{x}} 2024"), 13);
        assert_eq!(field_numbers("{:99999999999999999999999}"), usize::MAX);
        let wide =
            |w: u64| ChatTemplate::new(format!("{{{{ '{{:>{w}}}'.format(1) }}}}"), "f.jinja");
        assert_eq!(
            render_template(&wide(5), &[], &options(16), None, None).unwrap(),
            "    1"
        );
        let err = render_template(&wide(1 << 40), &[], &options(16), None, None).unwrap_err();
        assert!(
            matches!(
                err,
                Error::TemplateLimit {
                    bound: TemplateBound::Fuel { .. },
                    ..
                }
            ),
            "{err}"
        );
    }
}
