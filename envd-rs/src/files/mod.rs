//! GET and POST /files (envd/internal/files): downloads and uploads as a
//! chosen user, authorised by the access token or a v1 URL signature.
//!
//! The contract is E2B's envd's `/files`: `path` and `username` query
//! parameters, raw bytes out (Range, conditional requests, optional gzip),
//! multipart/form-data or application/octet-stream in, a JSON array of
//! written entries back, and errors as {"code": status, "message": ...}.

mod download;
mod encoding;
mod metadata;
mod mime;
mod multipart;
mod upload;

use std::sync::Arc;

use hyper::http::request::Parts;
use hyper::Method;

use crate::error::{Code, Error};
use crate::http::{self, Request, Response};
use crate::state::State;
use crate::user::User;

const ACCESS_TOKEN_HEADER: &str = "x-access-token";

pub async fn handle(st: Arc<State>, req: Request) -> Response {
    let m = req.method().clone();
    if m == Method::GET || m == Method::HEAD {
        download::download(st, req).await
    } else if m == Method::POST {
        upload::upload(st, req).await
    } else {
        let mut r = http::error_json(405, &format!("method {m} not allowed on /files"));
        r.headers_mut()
            .insert(hyper::header::ALLOW, "GET, HEAD, POST".parse().unwrap());
        r
    }
}

/// Query is a request's query, parsed strictly (Go's url.ParseQuery): a
/// malformed query would otherwise be dropped silently and, say, an upload
/// land in the wrong place.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Result<Query, Error> {
        let mut out = Vec::new();
        for p in raw.unwrap_or("").split('&') {
            if p.is_empty() {
                continue;
            }
            let bad = |m: String| Error::invalid(format!("invalid argument: malformed query: {m}"));
            if p.contains(';') {
                return Err(bad("invalid semicolon separator in query".into()));
            }
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let k = http::query_unescape(k).map_err(bad)?;
            let v = http::query_unescape(v).map_err(bad)?;
            out.push((k, v));
        }
        Ok(Query(out))
    }

    /// get is the first value of key, "" without one (Go's Values.Get).
    pub fn get(&self, key: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }
}

/// authorize enforces the access token for /files, which the server leaves
/// to us because a signed URL may stand in for the token. A present
/// X-Access-Token decides on its own: a wrong header is not rescued by a
/// signature. The signature covers the raw `path` and `username` values.
fn authorize(st: &State, parts: &Parts, q: &Query, op: &str) -> Result<(), Error> {
    if !st.token_is_set() {
        return Ok(());
    }
    if let Some(v) = parts.headers.get(ACCESS_TOKEN_HEADER) {
        let v = v.to_str().unwrap_or("");
        if !v.is_empty() {
            if st.token_equal(v) {
                return Ok(());
            }
            return Err(Error::unauthenticated(
                "access token present in header but does not match",
            ));
        }
    }
    st.verify_signature(
        q.get("signature"),
        q.get("path"),
        op,
        q.get("username"),
        q.get("signature_expiration"),
    )
}

/// unauthorized answers a failed authorize: always 401 by E2B's contract.
fn unauthorized(st: &State, method: &Method, err: &Error) -> Response {
    log!(st.log, Warn, "unauthorized /files request", "method" => method, "err" => err.message);
    http::error_json(401, &err.message)
}

/// fail answers err with its status; server-side failures are logged at
/// error level, client mistakes only at debug.
fn fail(st: &State, method: &Method, err: &Error) -> Response {
    let status = err.http_status();
    if status >= 500 {
        log!(st.log, Error, "/files request failed", "method" => method, "status" => status, "err" => err.message);
    } else {
        log!(st.log, Debug, "/files request failed", "method" => method, "status" => status, "err" => err.message);
    }
    http::error_json(status, &err.message)
}

/// named_user is the request's `username`, else the default user, with the
/// words E2B's envd answers /files with for an unknown one.
fn named_user(st: &State, name: &str) -> Result<Arc<User>, Error> {
    st.user_named(Some(name)).map_err(|e| {
        let n = if name.is_empty() {
            st.defaults().user
        } else {
            name.to_string()
        };
        if e.code == Code::Unauthenticated && !n.is_empty() {
            Error::unauthenticated(format!("error looking up user '{n}': user: unknown user {n}"))
        } else {
            e
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_query() {
        let q = Query::parse(Some("path=%2Fa+b&username=&path=second&flag")).unwrap();
        assert_eq!(q.get("path"), "/a b");
        assert_eq!(q.get("username"), "");
        assert_eq!(q.get("flag"), "");
        assert_eq!(q.get("missing"), "");
        let e = Query::parse(Some("path=%zz")).err().unwrap();
        assert_eq!(
            e.message,
            "invalid argument: malformed query: invalid URL escape \"%zz\""
        );
        assert_eq!(e.http_status(), 400);
        assert!(Query::parse(Some("a=1;b=2")).is_err());
        assert!(Query::parse(Some("a=%4")).is_err());
        assert!(Query::parse(None).unwrap().0.is_empty());
    }
}
