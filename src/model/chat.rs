//! Chat: a conversation rendered with the model's own chat template (Jinja, the
//! `chat_template` of `tokenizer_config.json` or GGUF's `tokenizer.chat_template`), the way
//! transformers' `apply_chat_template` renders it: `trim_blocks` and `lstrip_blocks`, loop
//! controls, `raise_exception`, a Python-style `tojson`, `strftime_now`, Python's string
//! methods (`.strip()`, `.startswith()`, ...), and `bos_token`/`eos_token`.

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use super::Tokenizer;
use crate::error::{Error, Result};

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
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// End with the header of the assistant's next turn, so the model writes it.
    pub add_generation_prompt: bool,
    /// The time `strftime_now` formats, in seconds since 1970 (default: now). Templates such
    /// as Llama 3.2's put today's date in the system prompt.
    pub now: Option<i64>,
}

fn template_error(e: minijinja::Error) -> Error {
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        reason.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::invalid("chat", format!("the chat template failed: {reason}"))
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
/// separators on one line, or `","` and one item a line with an indent.
fn python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The `tojson` filter as transformers defines it (Python's `json.dumps`, not HTML-escaped).
fn tojson(
    value: Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Renders `messages` with `template`; `bos`/`eos` are the texts of those tokens.
pub fn render_template(
    template: &str,
    messages: &[ChatMessage],
    options: &ChatOptions,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(template_error)?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    let now = options.now.unwrap_or_else(now_secs);
    env.add_function("strftime_now", move |format: String| strftime(&format, now));
    env.add_template("chat", template).map_err(template_error)?;
    let context = minijinja::context! {
        messages => Value::from(Serde(messages)),
        add_generation_prompt => options.add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    };
    env.get_template("chat")
        .and_then(|t| t.render(context))
        .map_err(template_error)
}

impl Tokenizer {
    /// Renders a conversation with the model's chat template, ready for
    /// [`encode_with_special`](Tokenizer::encode_with_special) (the template writes the BOS
    /// token itself where the model wants one). A model without a template is an error.
    pub fn render_chat(&self, messages: &[ChatMessage], options: &ChatOptions) -> Result<String> {
        let template = self.chat_template().ok_or_else(|| {
            Error::invalid(
                "chat",
                "the model has no chat template (tokenizer_config.json `chat_template` or GGUF \
                 `tokenizer.chat_template`); use plain generation",
            )
        })?;
        let (bos, eos) = self.special_texts();
        render_template(template, messages, options, bos, eos)
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
        python_json(&v, None, 0, &mut s);
        assert_eq!(s, r#"{"a": [1, "é"], "b": {}}"#);
        let mut s = String::new();
        python_json(&v, Some(2), 0, &mut s);
        assert_eq!(s, "{\n  \"a\": [\n    1,\n    \"é\"\n  ],\n  \"b\": {}\n}");
    }

    #[test]
    fn renders_and_raises() {
        let template = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}\n<{{ m.role }}>{{ m['content'].strip() }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
        let msgs = [
            ChatMessage::new("user", " hi "),
            ChatMessage::new("assistant", "yo"),
        ];
        let options = ChatOptions {
            add_generation_prompt: true,
            now: Some(0),
        };
        let out = render_template(template, &msgs, &options, Some("<s>"), None).unwrap();
        assert_eq!(out, "<s><user>hi<assistant>yo<assistant>");
        let err = render_template(
            template,
            &[ChatMessage::new("system", "x")],
            &options,
            None,
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("no system"), "{err}");
    }
}
