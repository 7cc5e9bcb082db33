//! The Connect protocol in its JSON codec, as much of it as E2B's SDKs and
//! sandboxd's envdconn speak: unary calls (`application/json`), server
//! streams and client streams (`application/connect+json`, 5-byte
//! envelopes, an end-of-stream message that carries the error), the
//! `Connect-Timeout-Ms` header, and protojson's encodings (int64 as a
//! string). The binary codec is not served: a client that
//! asks for it gets 415.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::http::request::Parts;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::{Code, Error};
use crate::http::{self, Response};

/// MAX_MESSAGE bounds one request message, so that a hostile client cannot
/// make envd buffer an arbitrarily large frame (envd's maxMessageBytes).
pub const MAX_MESSAGE: usize = 32 << 20;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END_STREAM: u8 = 0x02;

fn content_type(parts: &Parts) -> &str {
    parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn base_type(ct: &str) -> String {
    ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// timeout is the call's `Connect-Timeout-Ms`, if any (0 = none).
pub fn timeout(parts: &Parts) -> Option<Duration> {
    let ms: u64 = parts
        .headers
        .get("connect-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// header is a request header's value as a string ("" when absent).
pub fn header<'a>(parts: &'a Parts, name: &str) -> &'a str {
    parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// is_stream_request says whether the request is a streaming call by its
/// content type (the route decides what the call is; this checks it).
pub fn is_stream_request(parts: &Parts) -> bool {
    base_type(content_type(parts)).starts_with("application/connect+")
}

/// unsupported answers a request whose codec envd does not serve.
pub fn unsupported_media(parts: &Parts) -> Response {
    let mut r = http::status(415);
    let accept = if is_stream_request(parts) {
        "application/connect+json"
    } else {
        "application/json"
    };
    r.headers_mut().insert("accept-post", accept.parse().unwrap());
    r
}

// ---- unary ----------------------------------------------------------------

/// read_unary reads a unary call's JSON message. An error is already the
/// response to send.
pub async fn read_unary<T: DeserializeOwned>(req: http::Request) -> Result<(Parts, T), Response> {
    let (parts, mut body) = req.into_parts();
    let ct = base_type(content_type(&parts));
    if ct != "application/json" {
        let resp = unsupported_media(&parts);
        return Err(http::finish_unread(&parts, &mut body, resp).await);
    }
    if !matches!(header(&parts, "content-encoding"), "" | "identity") {
        let resp = unary_error(&Error::new(Code::Unimplemented, "request compression is not supported"));
        return Err(http::finish_unread(&parts, &mut body, resp).await);
    }
    let msg = match read_limited(&mut body, MAX_MESSAGE).await {
        Ok(b) => b,
        Err(e) => return Err(http::finish_unread(&parts, &mut body, unary_error(&e)).await),
    };
    match decode::<T>(&msg) {
        Ok(v) => Ok((parts, v)),
        Err(e) => Err(unary_error(&e)),
    }
}

/// unary_ok answers a unary call's message.
pub fn unary_ok<T: Serialize>(v: &T) -> Response {
    http::bytes(200, "application/json", serde_json::to_vec(v).unwrap_or_default())
}

#[derive(Serialize)]
struct WireError<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
}

/// unary_error answers a unary call's error with its Connect status.
pub fn unary_error(e: &Error) -> Response {
    let body = serde_json::to_vec(&WireError {
        code: e.code.as_str(),
        message: &e.message,
    })
    .unwrap_or_default();
    http::bytes(e.code.connect_status(), "application/json", body)
}

/// unary answers a unary call's result.
pub fn unary<T: Serialize>(r: Result<T, Error>) -> Response {
    match r {
        Ok(v) => unary_ok(&v),
        Err(e) => unary_error(&e),
    }
}

/// serve_unary is a whole unary call: it reads the message, runs f on it
/// and answers f's result, or answers the read's error without running f.
pub async fn serve_unary<T, R, F, Fut>(req: http::Request, f: F) -> Response
where
    T: DeserializeOwned,
    R: Serialize,
    F: FnOnce(Parts, T) -> Fut,
    Fut: std::future::Future<Output = Result<R, Error>>,
{
    match read_unary(req).await {
        Ok((parts, msg)) => unary(f(parts, msg).await),
        Err(r) => r,
    }
}

// ---- streams --------------------------------------------------------------

/// read_stream_request reads the one message of a server-streaming call.
pub async fn read_stream_request<T: DeserializeOwned>(req: http::Request) -> Result<(Parts, T), Response> {
    let (parts, mut body) = req.into_parts();
    if base_type(content_type(&parts)) != "application/connect+json" {
        let resp = unsupported_media(&parts);
        return Err(http::finish_unread(&parts, &mut body, resp).await);
    }
    let mut r = EnvelopeReader::new(body);
    match r.next::<T>().await {
        Some(Ok(v)) => {
            // Read the body to its end: a body left unread makes hyper close
            // the connection under a client that reuses it.
            while r.next::<serde::de::IgnoredAny>().await.is_some() {}
            Ok((parts, v))
        }
        Some(Err(e)) => Err(stream_error(&e)),
        None => Err(stream_error(&Error::invalid("unary request has zero messages"))),
    }
}

/// stream_error answers a streaming call that failed before its first
/// message: HTTP 200 and an end-of-stream message with the error.
pub fn stream_error(e: &Error) -> Response {
    let mut s = Stream::start(1);
    let _ = s.tx.try_send(end_envelope(Some(e)));
    s.response()
}

/// Stream is a streaming response under way.
pub struct Stream {
    tx: mpsc::Sender<Bytes>,
    // In a Mutex so that a Stream is Sync and a task that feeds it is Send.
    body: std::sync::Mutex<Option<http::Body>>,
}

impl Stream {
    /// start makes a stream whose body holds up to buffer messages before
    /// send waits for the client. Answer the call with its `response()` and
    /// feed it from a task.
    pub fn start(buffer: usize) -> Stream {
        let (tx, body) = http::channel(buffer);
        Stream {
            tx,
            body: std::sync::Mutex::new(Some(body)),
        }
    }

    /// response is the HTTP response that carries the stream (once).
    pub fn response(&mut self) -> Response {
        let mut r = Response::new(
            self.body
                .get_mut()
                .unwrap()
                .take()
                .expect("Stream::response called twice"),
        );
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, "application/connect+json".parse().unwrap());
        r
    }

    /// send sends one message; Err when the client has gone.
    pub async fn send<T: Serialize>(&self, v: &T) -> Result<(), Gone> {
        let json = serde_json::to_vec(v).unwrap_or_default();
        self.tx.send(envelope(0, &json)).await.map_err(|_| Gone)
    }

    /// end sends the end-of-stream message: success, or the error.
    pub async fn end(self, err: Option<&Error>) {
        let _ = self.tx.send(end_envelope(err)).await;
    }

    /// closed resolves when the client has gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Gone says the client of a stream has gone away.
#[derive(Debug)]
pub struct Gone;

fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.extend_from_slice(&[flags]);
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b.freeze()
}

fn end_envelope(err: Option<&Error>) -> Bytes {
    let v = match err {
        Some(e) => serde_json::json!({"error": WireError { code: e.code.as_str(), message: &e.message }}),
        None => serde_json::json!({}),
    };
    envelope(FLAG_END_STREAM, &serde_json::to_vec(&v).unwrap_or_default())
}

/// EnvelopeReader reads the messages of a streaming request body.
pub struct EnvelopeReader {
    body: Incoming,
    buf: BytesMut,
    done: bool,
}

impl EnvelopeReader {
    pub fn new(body: Incoming) -> EnvelopeReader {
        EnvelopeReader {
            body,
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// next is the next message: None at the end of the body or after an
    /// end-of-stream envelope.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Option<Result<T, Error>> {
        if self.done {
            return None;
        }
        loop {
            if self.buf.len() >= 5 {
                let flags = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if len > MAX_MESSAGE {
                    self.done = true;
                    return Some(Err(Error::new(
                        Code::ResourceExhausted,
                        format!("message size {len} is larger than configured max {MAX_MESSAGE}"),
                    )));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let msg = self.buf.split_to(len);
                    if flags & FLAG_COMPRESSED != 0 {
                        self.done = true;
                        return Some(Err(Error::new(
                            Code::Unimplemented,
                            "message compression is not supported",
                        )));
                    }
                    if flags & FLAG_END_STREAM != 0 {
                        self.done = true;
                        return None;
                    }
                    return Some(decode::<T>(&msg));
                }
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(Error::new(Code::Canceled, format!("read request: {e}"))));
                }
                None => {
                    self.done = true;
                    if !self.buf.is_empty() {
                        return Some(Err(Error::invalid("protocol error: incomplete envelope")));
                    }
                    return None;
                }
            }
        }
    }
}

// ---- bodies and JSON ------------------------------------------------------

/// read_limited reads a whole body of at most limit bytes.
pub async fn read_limited(body: &mut Incoming, limit: usize) -> Result<Bytes, Error> {
    let mut buf = BytesMut::new();
    while let Some(f) = body.frame().await {
        let f = f.map_err(|e| Error::new(Code::Canceled, format!("read request: {e}")))?;
        if let Ok(d) = f.into_data() {
            if buf.len() + d.len() > limit {
                return Err(Error::new(
                    Code::ResourceExhausted,
                    format!("message is larger than configured max {limit}"),
                ));
            }
            buf.extend_from_slice(&d);
        }
    }
    Ok(buf.freeze())
}

/// decode unmarshals a JSON message; an empty body is the empty message.
pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, Error> {
    let b = if b.iter().all(|c| c.is_ascii_whitespace()) {
        b"{}".as_slice()
    } else {
        b
    };
    serde_json::from_slice(b).map_err(|e| Error::invalid(format!("unmarshal message: {e}")))
}

/// protojson's encodings of the scalar types serde does not write the way
/// protojson does. Use with `#[serde(with = "...")]`.
pub mod pj {
    use serde::de::{self, Deserializer, Visitor};
    use serde::Serializer;
    use std::fmt;

    /// int64 and uint64 are strings in protojson; numbers are accepted too.
    #[allow(dead_code)] // both directions, whichever a message needs
    pub mod i64s {
        use super::*;
        pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&v.to_string())
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
            d.deserialize_any(IntVisitor)
                .and_then(|v| i64::try_from(v).map_err(de::Error::custom))
        }
    }

    #[allow(dead_code)] // both directions, whichever a message needs
    pub mod u32s {
        use super::*;
        pub fn serialize<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_u32(*v)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
            d.deserialize_any(IntVisitor)
                .and_then(|v| u32::try_from(v).map_err(de::Error::custom))
        }
    }

    struct IntVisitor;

    impl<'de> Visitor<'de> for IntVisitor {
        type Value = i128;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer or a string holding one")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
            Ok(v as i128)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
            Ok(v as i128)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<i128, E> {
            if v.fract() == 0.0 {
                Ok(v as i128)
            } else {
                Err(E::custom("not an integer"))
            }
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<i128, E> {
            v.trim().parse::<i128>().map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<i128, E> {
            Ok(0)
        }
    }

    /// is_zero helps skip protojson's unpopulated scalars on output.
    pub fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
        *v == T::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Serialize, Default, PartialEq, Debug)]
    #[serde(rename_all = "camelCase", default)]
    struct M {
        #[serde(with = "pj::i64s")]
        big: i64,
        #[serde(with = "pj::u32s")]
        pid: u32,
    }

    #[test]
    fn protojson_scalars() {
        let m: M = decode(br#"{"big":"-12","pid":"7"}"#).unwrap();
        assert_eq!(m, M { big: -12, pid: 7 });
        let m: M = decode(br#"{"big":12,"pid":7,"unknown":1}"#).unwrap();
        assert_eq!(m, M { big: 12, pid: 7 });
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"big":"12","pid":7}"#);
        let m: M = decode(b"").unwrap();
        assert_eq!(m, M::default());
        assert!(decode::<M>(br#"{"pid":-1}"#).is_err());
    }

    #[test]
    fn envelopes() {
        let e = envelope(0, b"{}");
        assert_eq!(&e[..], &[0, 0, 0, 0, 2, b'{', b'}']);
        let end = end_envelope(Some(&Error::not_found("process with pid 1 not found")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
    }
}
