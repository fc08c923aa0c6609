//! The API's answers on the wire: JSON bodies with their length, and Server-Sent Events
//! streams (`text/event-stream`, one `data: {json}` event per chunk, `data: [DONE]` last, the
//! connection closed at the end since no length is declared).

use std::io::{self, Write};

use serde_json::Value;

use super::http::Status;

/// The head of a JSON answer of `len` bytes; a 503 asks the client to retry in a second.
fn json_head(status: Status, len: usize) -> String {
    let retry = if status == Status::Unavailable {
        "Retry-After: 1\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {}\r\n\
         Content-Type: application/json\r\n\
         Content-Length: {len}\r\n\
         {retry}\
         Cache-Control: no-cache\r\n\
         Connection: close\r\n\r\n",
        status.line()
    )
}

/// Writes a whole JSON answer.
pub fn json(out: &mut impl Write, status: Status, body: &Value) -> io::Result<()> {
    let body = body.to_string();
    out.write_all(json_head(status, body.len()).as_bytes())?;
    out.write_all(body.as_bytes())?;
    out.flush()
}

/// An event stream on a connection: [`Events::start`] writes the head, [`Events::send`] each
/// chunk, [`Events::done`] the end marker.
pub struct Events<'a, W: Write> {
    out: &'a mut W,
}

impl<'a, W: Write> Events<'a, W> {
    /// Writes the head of a 200 event stream.
    pub fn start(out: &'a mut W) -> io::Result<Self> {
        out.write_all(
            b"HTTP/1.1 200 OK\r\n\
              Content-Type: text/event-stream\r\n\
              Cache-Control: no-cache\r\n\
              Connection: close\r\n\r\n",
        )?;
        out.flush()?;
        Ok(Events { out })
    }

    /// One event carrying `chunk`, flushed at once so the client sees it.
    pub fn send(&mut self, chunk: &Value) -> io::Result<()> {
        write!(self.out, "data: {chunk}\n\n")?;
        self.out.flush()
    }

    /// The end marker OpenAI's clients wait for.
    pub fn done(self) -> io::Result<()> {
        self.out.write_all(b"data: [DONE]\n\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_a_head_then_data_events_then_done() {
        let mut out = Vec::new();
        let mut events = Events::start(&mut out).unwrap();
        events.send(&serde_json::json!({"a": "x\ny"})).unwrap();
        events.done().unwrap();
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(head.contains("Content-Type: text/event-stream"));
        // A newline inside a value is escaped by JSON, so each event stays on one line.
        assert_eq!(body, "data: {\"a\":\"x\\ny\"}\n\ndata: [DONE]\n\n");
    }
}
