//! The API's answers through hyper: JSON bodies with their length, and Server-Sent Events
//! streams (`text/event-stream`, one `data: {json}` event per chunk, `data: [DONE]` last) whose
//! body is a channel the request's thread feeds while the engine generates.

use std::io;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::http::{Answer, Channel, Status};

/// Events a stream holds before its thread waits for the client to take them.
const EVENTS: usize = 16;

/// A whole JSON answer; a 503 asks the client to retry in a second.
pub fn json(status: Status, body: &Value) -> Answer {
    let mut answer = hyper::Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *answer.status_mut() = status.to_code();
    let headers = answer.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == Status::Unavailable {
        headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    answer
}

/// Where a request's thread sends its answer: once, whole ([`Reply::json`]) or as the head of
/// an event stream ([`Reply::events`]) that it then feeds.
pub struct Reply {
    head: Option<oneshot::Sender<Answer>>,
}

impl Reply {
    /// A reply, and where its answer arrives (nothing when the reply is dropped unanswered).
    pub fn new() -> (Reply, oneshot::Receiver<Answer>) {
        let (send, receive) = oneshot::channel();
        (Reply { head: Some(send) }, receive)
    }

    fn send(&mut self, answer: Answer) -> io::Result<()> {
        let head = self
            .head
            .take()
            .ok_or_else(|| io::Error::other("answered twice"))?;
        head.send(answer)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    /// Sends a whole JSON answer.
    pub fn json(&mut self, status: Status, body: &Value) -> io::Result<()> {
        self.send(json(status, body))
    }

    /// Sends the head of a 200 event stream; its events follow through [`Events`].
    pub fn events(&mut self) -> io::Result<Events> {
        let (send, receive) = mpsc::channel(EVENTS);
        let mut answer = hyper::Response::new(Channel(receive).boxed());
        let headers = answer.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        self.send(answer)?;
        Ok(Events { send })
    }
}

/// An event stream being answered: [`Events::send`] each chunk, [`Events::done`] the end
/// marker. Sending waits while the client is slow to read, and fails once it has left.
pub struct Events {
    send: mpsc::Sender<Bytes>,
}

impl Events {
    fn write(&mut self, bytes: String) -> io::Result<()> {
        self.send
            .blocking_send(Bytes::from(bytes))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    /// One event carrying `chunk`.
    pub fn send(&mut self, chunk: &Value) -> io::Result<()> {
        self.write(format!("data: {chunk}\n\n"))
    }

    /// The end marker OpenAI's clients wait for.
    pub fn done(mut self) -> io::Result<()> {
        self.write("data: [DONE]\n\n".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_a_head_then_data_events_then_done() {
        let (mut reply, head) = Reply::new();
        let mut events = reply.events().unwrap();
        let answer = head.blocking_recv().unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()[CONTENT_TYPE], "text/event-stream");
        let reader = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let body = runtime.block_on(answer.into_body().collect()).unwrap();
            String::from_utf8(body.to_bytes().to_vec()).unwrap()
        });
        events.send(&serde_json::json!({"a": "x\ny"})).unwrap();
        events.done().unwrap();
        // A newline inside a value is escaped by JSON, so each event stays on one line.
        assert_eq!(
            reader.join().unwrap(),
            "data: {\"a\":\"x\\ny\"}\n\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn a_stream_whose_client_left_fails_to_send() {
        let (mut reply, head) = Reply::new();
        let mut events = reply.events().unwrap();
        drop(head);
        assert!(events.send(&serde_json::json!({})).is_err());
    }
}
