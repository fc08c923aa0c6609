//! The fields of an OpenAI completion request, read and checked: what the request asks the
//! model for, or an [`ApiError`] that names the field that is wrong.
//!
//! Fields that would change the tokens and that webtensor does not implement (penalties,
//! logit biases, several choices) are refused when set to anything but their neutral value,
//! rather than silently ignored; fields that change nothing (`user`, `model`) are accepted.

use serde_json::{Map, Value};
use webtensor_llm::{ChatMessage, Sampling};

use super::http::Status;

/// An OpenAI-style error: the status and the body's `error` object.
#[derive(Debug)]
pub struct ApiError {
    pub status: Status,
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// `invalid_request_error`, `server_busy`, `server_error`, ...
    pub kind: &'static str,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: Status::BadRequest,
            message: message.into(),
            param: Some(param.into()),
            kind: "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": null,
        }})
    }
}

/// What a completion request asks for (the prompt itself is read by the route).
#[derive(Debug)]
pub struct Params {
    /// Most tokens to generate; `None`: up to the end of the context.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// Strings that end the completion (not included in it).
    pub stops: Vec<String>,
}

/// Fields every completion request may carry; the route's own (`messages`, `prompt`) are
/// passed in `own`.
const COMMON: [&str; 17] = [
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stream",
    "stream_options",
    "stop",
    "n",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "echo",
];

/// Reads the common fields of a request body (a JSON object). `own` are the route's other
/// fields; any other field is an error that names it. `seed` defaults to `fallback_seed`.
pub fn read(
    obj: &Map<String, Value>,
    own: &[&str],
    fallback_seed: u64,
) -> Result<Params, ApiError> {
    if let Some(key) = obj
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        return Err(ApiError::invalid(
            key,
            format!("`{key}` is not a field webtensor implements; leave it out"),
        ));
    }
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    neutral(get("n"), "n", |v| v.as_u64() == Some(1), "1 (one choice)")?;
    for k in ["presence_penalty", "frequency_penalty"] {
        neutral(get(k), k, |v| v.as_f64() == Some(0.0), "0")?;
    }
    neutral(
        get("logit_bias"),
        "logit_bias",
        |v| v.as_object().is_some_and(|m| m.is_empty()),
        "empty",
    )?;
    neutral(
        get("logprobs"),
        "logprobs",
        |v| v == &Value::Bool(false),
        "false",
    )?;
    neutral(get("echo"), "echo", |v| v == &Value::Bool(false), "false")?;
    let max_tokens = match get("max_completion_tokens").or(get("max_tokens")) {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&n| n >= 1)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| ApiError::invalid("max_tokens", "must be a whole number ≥ 1"))?,
        ),
    };
    let number = |k: &str, default: f64, ok: &dyn Fn(f64) -> bool, what: &str| match get(k) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|&x| ok(x))
            .ok_or_else(|| ApiError::invalid(k, format!("must be a number {what}"))),
    };
    let temperature = number(
        "temperature",
        1.0,
        &|t| (0.0..=2.0).contains(&t),
        "from 0 to 2",
    )?;
    let top_p = number("top_p", 1.0, &|p| p > 0.0 && p <= 1.0, "in (0, 1]")?;
    let top_k = match get("top_k") {
        None => 0,
        Some(v) => v
            .as_u64()
            .and_then(|k| usize::try_from(k).ok())
            .ok_or_else(|| ApiError::invalid("top_k", "must be a whole number ≥ 0 (0: all)"))?,
    };
    let seed = match get("seed") {
        None => fallback_seed,
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|s| s as u64))
            .ok_or_else(|| ApiError::invalid("seed", "must be a whole number"))?,
    };
    let flag = |k: &str| match get(k) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| ApiError::invalid(k, "must be true or false")),
    };
    let stream = flag("stream")?;
    let include_usage = match get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.iter().find(|(k, _)| k.as_str() != "include_usage") {
            Some((k, _)) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    format!("`{k}` is not an option webtensor implements"),
                ))
            }
            None => o
                .get("include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        },
        Some(_) => return Err(ApiError::invalid("stream_options", "must be an object")),
    };
    let stops = match get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid("stop", "must be a string or up to 4 strings"))?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "must be a string or up to 4 strings",
            ))
        }
    };
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "an empty stop string would stop at once",
        ));
    }
    Ok(Params {
        max_tokens,
        sampling: Sampling {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            seed,
        },
        stream,
        include_usage,
        stops,
    })
}

/// Fails unless a field that webtensor does not implement is absent or neutral.
fn neutral(
    value: Option<&Value>,
    key: &str,
    is_neutral: impl Fn(&Value) -> bool,
    neutral: &str,
) -> Result<(), ApiError> {
    match value {
        Some(v) if !is_neutral(v) => Err(ApiError::invalid(
            key,
            format!("webtensor supports `{key}` only as {neutral}; got {v}"),
        )),
        _ => Ok(()),
    }
}

/// The `messages` of a chat request: each a `role` and a `content` that is text or a list of
/// text parts.
pub fn messages(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let bad = |m: String| ApiError::invalid("messages", m);
    let list = value
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| bad("must be a non-empty list of messages".into()))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let obj = m
                .as_object()
                .ok_or_else(|| bad(format!("message {i} is not an object")))?;
            if let Some(k) = obj
                .keys()
                .find(|k| !["role", "content"].contains(&k.as_str()))
            {
                return Err(bad(format!(
                    "message {i}: `{k}` is not a message field webtensor implements"
                )));
            }
            let role = obj
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("message {i} has no `role` string")))?;
            let content = match obj.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(
                        |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                            _ => Err(bad(format!("message {i}: only text parts are supported"))),
                        },
                    )
                    .collect::<Result<String, _>>()?,
                _ => return Err(bad(format!("message {i} has no `content` text"))),
            };
            Ok(ChatMessage::new(role, &content))
        })
        .collect()
}

/// The `prompt` of a completion request: a string, or a list of exactly one.
pub fn prompt(value: Option<&Value>) -> Result<String, ApiError> {
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(a[0].as_str().unwrap_or_default().to_string())
        }
        _ => Err(ApiError::invalid(
            "prompt",
            "must be a string (or a list of one string)",
        )),
    }
}

/// A completion's text cut at the first stop string: text is released as soon as no stop
/// string can begin in it, so a stream never shows a stop string or part of one.
pub struct StopCut {
    stops: Vec<String>,
    held: String,
}

impl StopCut {
    pub fn new(stops: Vec<String>) -> StopCut {
        StopCut {
            stops,
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to show, and whether a stop string was met
    /// (then the text is everything before it, and the completion is over).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest tail that begins some stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// The text held back at the end of the completion.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(text: &str, own: &[&str]) -> Result<Params, ApiError> {
        let v: Value = serde_json::from_str(text).unwrap();
        read(v.as_object().unwrap(), own, 7)
    }

    #[test]
    fn fields_are_read_and_unknown_or_unsupported_ones_named() {
        let p = read_json(
            r#"{"model":"m","max_tokens":5,"temperature":0,"seed":3,"stream":true,
                "stream_options":{"include_usage":true},"stop":["a","b"],"n":1,
                "presence_penalty":0,"prompt":"x"}"#,
            &["prompt"],
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!((p.sampling.temperature, p.sampling.seed), (0.0, 3));
        assert!(p.stream && p.include_usage);
        assert_eq!(p.stops, ["a", "b"]);
        assert_eq!(read_json("{}", &[]).unwrap().sampling.seed, 7);
        for (body, param) in [
            (r#"{"tools":[]}"#, "tools"),
            (r#"{"n":2}"#, "n"),
            (r#"{"frequency_penalty":0.5}"#, "frequency_penalty"),
            (r#"{"logit_bias":{"5":100}}"#, "logit_bias"),
            (r#"{"max_tokens":0}"#, "max_tokens"),
            (r#"{"temperature":"hot"}"#, "temperature"),
            (r#"{"top_p":0}"#, "top_p"),
            (r#"{"stop":""}"#, "stop"),
            (r#"{"stream":1}"#, "stream"),
        ] {
            let e = read_json(body, &["prompt"]).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert_eq!(e.status, Status::BadRequest);
        }
    }

    #[test]
    fn messages_and_prompts_take_the_openai_shapes() {
        let v: Value = serde_json::from_str(
            r#"[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}]"#,
        )
        .unwrap();
        let m = messages(Some(&v)).unwrap();
        assert_eq!(m[1], ChatMessage::new("user", "hi there"));
        for bad in [
            r#"[]"#,
            r#"[{"role":"user"}]"#,
            r#"[{"role":"user","content":"x","name":"a"}]"#,
        ] {
            let v: Value = serde_json::from_str(bad).unwrap();
            assert!(messages(Some(&v)).is_err(), "{bad}");
        }
        assert_eq!(prompt(Some(&Value::from("x"))).unwrap(), "x");
        assert!(prompt(Some(&serde_json::json!([1, 2]))).is_err());
    }

    #[test]
    fn stop_strings_cut_the_text_and_are_never_shown() {
        let mut cut = StopCut::new(vec!["END".into()]);
        assert_eq!(cut.push("abc E"), ("abc ".to_string(), false));
        assert_eq!(cut.push("N"), (String::new(), false));
        assert_eq!(cut.push("Dx"), (String::new(), true));
        let mut cut = StopCut::new(vec!["END".into()]);
        assert_eq!(cut.push("é E"), ("é ".to_string(), false));
        assert_eq!(cut.push("x"), ("Ex".to_string(), false));
        assert_eq!(cut.finish(), "");
        let mut none = StopCut::new(Vec::new());
        assert_eq!(none.push("all"), ("all".to_string(), false));
    }
}
