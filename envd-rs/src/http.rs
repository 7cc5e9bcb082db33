//! The response bodies every handler uses, and the small JSON helpers of
//! envd's plain-HTTP routes.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame};
use serde::Serialize;
use tokio::sync::mpsc;

pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;
pub type Response = hyper::Response<Body>;
pub type Request = hyper::Request<hyper::body::Incoming>;

pub fn empty() -> Body {
    full(Bytes::new())
}

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed_unsync()
}

/// status answers a status with no body.
pub fn status(code: u16) -> Response {
    let mut r = Response::new(empty());
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// bytes answers a status with a body of a content type.
pub fn bytes(code: u16, content_type: &str, b: impl Into<Bytes>) -> Response {
    let mut r = status(code);
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, content_type.parse().unwrap());
    *r.body_mut() = full(b);
    r
}

/// json answers a value as JSON (one line, as Go's json.Encoder writes it).
pub fn json<T: Serialize + ?Sized>(code: u16, v: &T) -> Response {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    bytes(code, "application/json", b)
}

/// error_json answers envd's (and E2B's) error body, {code, message}.
pub fn error_json(code: u16, message: &str) -> Response {
    #[derive(Serialize)]
    struct E<'a> {
        code: u16,
        message: &'a str,
    }
    json(code, &E { code, message })
}

/// channel is a streaming body fed by a bounded channel: the sender waits
/// while the client reads slowly (backpressure), and `Sender::closed`
/// resolves when the client has gone (hyper dropped the body).
pub fn channel(buffer: usize) -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel(buffer);
    (tx, ChannelBody { rx }.boxed_unsync())
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl HttpBody for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// MAX_DISCARD is what of an unread request body is read and dropped
/// before answering, so that the connection stays usable (a proxy's pool
/// reuses it) and a client still sending gets the answer rather than a
/// reset. Go's server discards 256 KiB the same way; hyper would close.
const MAX_DISCARD: usize = 256 << 10;

/// discard_unread reads and drops up to MAX_DISCARD bytes of what is left
/// of a request's body (none when the client waits for a 100 Continue). It
/// says whether the body was read to its end: if not, hyper closes the
/// connection after the answer.
pub async fn discard_unread(parts: &hyper::http::request::Parts, body: &mut hyper::body::Incoming) -> bool {
    if body.is_end_stream() {
        return true;
    }
    if parts.headers.contains_key(hyper::header::EXPECT) {
        return false;
    }
    let mut n = 0;
    while n <= MAX_DISCARD {
        match body.frame().await {
            Some(Ok(f)) => n += f.data_ref().map_or(0, |d| d.len()),
            Some(Err(_)) => return false,
            None => return true,
        }
    }
    false
}

/// finish_unread is resp to a request whose body the handler left unread
/// (what of it remains). A body still arriving after MAX_DISCARD makes hyper
/// close the connection, so the answer says `Connection: close`, as Go's
/// server does: a client or proxy that pooled the connection would send
/// its next request into the close and lose it (a 502 from sandboxd's
/// proxy).
pub async fn finish_unread(
    parts: &hyper::http::request::Parts,
    body: &mut hyper::body::Incoming,
    mut resp: Response,
) -> Response {
    if !discard_unread(parts, body).await {
        resp.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// unread answers resp to a request whose body the handler did not read.
pub async fn unread(req: Request, resp: Response) -> Response {
    let (parts, mut body) = req.into_parts();
    finish_unread(&parts, &mut body, resp).await
}

/// query_pairs splits a URL's query into decoded pairs, leaving out a pair
/// with a broken escape (as Go's URL.Query does).
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((query_unescape(k).ok()?, query_unescape(v).ok()?))
        })
        .collect()
}

/// query_get is the first value of a query key, as Go's Query().Get.
pub fn query_get(query: Option<&str>, key: &str) -> Option<String> {
    query_pairs(query).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// query_unescape is Go's url.QueryUnescape: %XX escapes and '+' as a space; a
/// broken escape is an error.
pub fn query_unescape(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let h = b.get(i + 1).and_then(|c| (*c as char).to_digit(16));
                let l = b.get(i + 2).and_then(|c| (*c as char).to_digit(16));
                match (h, l) {
                    (Some(h), Some(l)) => out.push((h << 4 | l) as u8),
                    _ => {
                        let end = (i + 3).min(b.len());
                        return Err(format!("invalid URL escape {:?}", String::from_utf8_lossy(&b[i..end])));
                    }
                }
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = Some("path=%2Fhome%2Fuser%2Fa+b.txt&username=user&x=%zz&empty=");
        assert_eq!(query_get(q, "path").as_deref(), Some("/home/user/a b.txt"));
        assert_eq!(query_get(q, "username").as_deref(), Some("user"));
        assert_eq!(query_get(q, "x"), None);
        assert_eq!(query_get(q, "empty").as_deref(), Some(""));
        assert_eq!(query_get(q, "missing"), None);
        assert!(query_unescape("100%").is_err());
        assert!(query_unescape("%4").is_err());
        assert_eq!(query_unescape("a%2Fb+c").unwrap(), "a/b c");
    }
}
