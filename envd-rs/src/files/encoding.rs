//! Content codings (Accept-Encoding, Content-Encoding) and the MIME header
//! parameters /files reads and writes (envd/internal/files/encoding.go, Go's
//! mime.ParseMediaType and mime.FormatMediaType).

use std::collections::BTreeMap;

use hyper::HeaderMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

pub const NOT_ACCEPTABLE: &str = "no acceptable content encoding: supported are gzip and identity";

/// Accepted holds the qualities an Accept-Encoding gives the codings we
/// care about; -1 means not listed.
#[derive(Debug)]
struct Accepted {
    gzip: f64,
    identity: f64,
    star: f64,
}

impl Accepted {
    fn identity_q(&self) -> f64 {
        if self.identity >= 0.0 {
            self.identity
        } else if self.star >= 0.0 {
            self.star
        } else {
            1.0
        }
    }
}

/// parse_accept reads every Accept-Encoding line; present is false when
/// the client sent none.
fn parse_accept(h: &HeaderMap) -> (Accepted, bool) {
    let mut a = Accepted {
        gzip: -1.0,
        identity: -1.0,
        star: -1.0,
    };
    let mut present = false;
    for v in h.get_all(hyper::header::ACCEPT_ENCODING) {
        present = true;
        let v = String::from_utf8_lossy(v.as_bytes());
        for elem in v.split(',') {
            let Some((coding, q)) = parse_coding_elem(elem) else {
                continue;
            };
            match coding.as_str() {
                "gzip" | "x-gzip" => a.gzip = a.gzip.max(q),
                "identity" => a.identity = a.identity.max(q),
                "*" => a.star = a.star.max(q),
                _ => {}
            }
        }
    }
    (a, present)
}

fn parse_coding_elem(elem: &str) -> Option<(String, f64)> {
    let (coding, params) = elem.split_once(';').unwrap_or((elem, ""));
    let coding = coding.trim().to_ascii_lowercase();
    if coding.is_empty() {
        return None;
    }
    let mut q = 1.0;
    for p in params.split(';') {
        let Some((name, val)) = p.trim().split_once('=') else {
            continue;
        };
        if !name.trim().eq_ignore_ascii_case("q") {
            continue;
        }
        let f: f64 = val.trim().parse().ok()?;
        if !(0.0..=1.0).contains(&f) {
            return None;
        }
        q = f;
    }
    Some((coding, q))
}

/// negotiate picks the response coding: gzip only when the client names it
/// (or refuses identity and allows "*"); None when nothing is acceptable.
pub fn negotiate(h: &HeaderMap) -> Option<Coding> {
    let (a, present) = parse_accept(h);
    if !present {
        return Some(Coding::Identity);
    }
    let ranked = if a.identity >= 0.0 { a.identity } else { a.star };
    let id_q = a.identity_q();
    if a.gzip > 0.0 && a.gzip >= ranked {
        Some(Coding::Gzip)
    } else if id_q > 0.0 {
        Some(Coding::Identity)
    } else if a.gzip < 0.0 && a.star > 0.0 {
        Some(Coding::Gzip)
    } else {
        None
    }
}

/// identity_acceptable says whether the client takes unencoded bytes at all.
pub fn identity_acceptable(h: &HeaderMap) -> bool {
    parse_accept(h).0.identity_q() > 0.0
}

/// request_gzip says whether the request body is gzip: Ok(false) for none
/// or identity, an error message for another coding.
pub fn request_gzip(h: &HeaderMap) -> Result<bool, String> {
    let ce = h
        .get(hyper::header::CONTENT_ENCODING)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_ascii_lowercase());
    match ce.as_deref() {
        None | Some("") | Some("identity") => Ok(false),
        Some("gzip") | Some("x-gzip") => Ok(true),
        Some(other) => Err(format!(
            "invalid argument: unsupported Content-Encoding {other:?}, supported are gzip and identity"
        )),
    }
}

fn is_tspecial(c: u8) -> bool {
    b"()<>@,;:\\\"/[]?=".contains(&c)
}

fn is_token_char(c: u8) -> bool {
    c > 0x20 && c < 0x7f && !is_tspecial(c)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_token_char)
}

/// MediaError is how a media type failed to parse: a bad type loses it
/// all; a bad parameter keeps the type (Go's ErrInvalidMediaParameter).
#[derive(Debug, PartialEq)]
pub enum MediaError {
    Type(String),
    Param(String),
}

impl MediaError {
    pub fn message(&self) -> &str {
        match self {
            MediaError::Type(m) | MediaError::Param(m) => m,
        }
    }
}

pub type Params = BTreeMap<String, String>;

/// parse_media_type is Go's mime.ParseMediaType: the type lower-cased, the
/// parameters by lower-cased name (quoted strings unquoted, RFC 2231
/// `name*=charset''%XX` decoded).
pub fn parse_media_type(v: &str) -> Result<(String, Params), (String, MediaError)> {
    let (base, rest) = v.split_once(';').unwrap_or((v, ""));
    let base = base.trim().to_ascii_lowercase();
    let ok_type = match base.split_once('/') {
        Some((a, b)) => is_token(a) && is_token(b),
        None => is_token(&base),
    };
    if !ok_type {
        return Err((
            String::new(),
            MediaError::Type("mime: expected token after slash".into()),
        ));
    }
    let mut params = Params::new();
    let mut ext: BTreeMap<String, String> = BTreeMap::new();
    let mut r = rest;
    loop {
        r = r.trim_start();
        if r.is_empty() || r == ";" {
            break;
        }
        let Some((name, value, after)) = consume_param(r) else {
            return Err((base, MediaError::Param("mime: invalid media parameter".into())));
        };
        let map = if name.ends_with('*') { &mut ext } else { &mut params };
        let key = name.trim_end_matches('*').to_string();
        if map.insert(key, value).is_some() {
            return Err((base, MediaError::Type("mime: duplicate parameter name".into())));
        }
        if after.is_empty() {
            break;
        }
        match after.strip_prefix(';') {
            Some(a) => r = a,
            None => return Err((base, MediaError::Param("mime: invalid media parameter".into()))),
        }
    }
    for (n, v) in ext {
        // charset'language'value
        let mut it = v.splitn(3, '\'');
        let (cs, _, val) = (it.next().unwrap_or(""), it.next(), it.next());
        if let Some(val) = val {
            if cs.eq_ignore_ascii_case("utf-8") || cs.eq_ignore_ascii_case("us-ascii") {
                if let Some(d) = percent_decode_strict(val) {
                    params.insert(n, d);
                }
            }
        }
    }
    Ok((base, params))
}

/// consume_param reads `name=value` (value a token or a quoted string)
/// and returns it with what follows.
fn consume_param(s: &str) -> Option<(String, String, &str)> {
    let eq = s.find('=')?;
    let name = s[..eq].trim();
    if !is_token(name) {
        return None;
    }
    let v = s[eq + 1..].trim_start();
    let (value, after) = if let Some(q) = v.strip_prefix('"') {
        let mut out = Vec::new();
        let b = q.as_bytes();
        let mut i = 0;
        loop {
            let c = *b.get(i)?;
            match c {
                b'"' => break,
                b'\\' if i + 1 < b.len() => {
                    out.push(b[i + 1]);
                    i += 1;
                }
                _ => out.push(c),
            }
            i += 1;
        }
        (String::from_utf8_lossy(&out).into_owned(), &q[i + 1..])
    } else {
        let end = v.bytes().position(|c| !is_token_char(c)).unwrap_or(v.len());
        if end == 0 {
            return None;
        }
        (v[..end].to_string(), &v[end..])
    };
    Some((name.to_ascii_lowercase(), value, after.trim_start()))
}

fn percent_decode_strict(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = (*b.get(i + 1)? as char).to_digit(16)?;
            let l = (*b.get(i + 2)? as char).to_digit(16)?;
            out.push((h << 4 | l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// disposition is Go's mime.FormatMediaType("inline", {"filename": name}).
pub fn disposition(name: &str) -> String {
    let needs_encoding = name.chars().any(|r| !(' '..='~').contains(&r) && r != '\t');
    if needs_encoding {
        let mut s = String::from("inline; filename*=utf-8''");
        for c in name.bytes() {
            if c <= b' ' || c >= 0x7f || c == b'*' || c == b'\'' || c == b'%' || is_tspecial(c) {
                s.push_str(&format!("%{c:02X}"));
            } else {
                s.push(c as char);
            }
        }
        return s;
    }
    if is_token(name) {
        return format!("inline; filename={name}");
    }
    let mut s = String::from("inline; filename=\"");
    for c in name.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ae(vals: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in vals {
            h.append(hyper::header::ACCEPT_ENCODING, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn negotiation() {
        use Coding::*;
        let cases: &[(&[&str], Option<Coding>)] = &[
            (&[], Some(Identity)),
            (&["gzip"], Some(Gzip)),
            (&["gzip;q=0.5"], Some(Gzip)),
            (&["gzip;q=0.5, identity"], Some(Identity)),
            (&["identity;q=0.5, gzip"], Some(Gzip)),
            (&["br"], Some(Identity)),
            (&["gzip;q=0"], Some(Identity)),
            (&["identity;q=0"], None),
            (&["*;q=0"], None),
            (&["identity;q=0, *"], Some(Gzip)),
            (&["gzip;q=2"], Some(Identity)),
            (&["x-gzip, deflate"], Some(Gzip)),
            (&["deflate", "gzip"], Some(Gzip)),
        ];
        for (vals, want) in cases {
            assert_eq!(negotiate(&ae(vals)), *want, "{vals:?}");
        }
        assert!(!identity_acceptable(&ae(&["identity;q=0"])));
        assert!(identity_acceptable(&ae(&["gzip"])));
    }

    #[test]
    fn media_types() {
        let (t, p) = parse_media_type("Multipart/Form-Data; boundary=\"abc def\"").unwrap();
        assert_eq!(t, "multipart/form-data");
        assert_eq!(p["boundary"], "abc def");
        let (t, p) = parse_media_type("form-data; name=\"file\"; filename=\"/home/user/a \\\"q\\\".txt\"").unwrap();
        assert_eq!(t, "form-data");
        assert_eq!(p["name"], "file");
        assert_eq!(p["filename"], "/home/user/a \"q\".txt");
        let (_, p) = parse_media_type("form-data; name=file; filename*=utf-8''%C3%A9t%C3%A9.txt").unwrap();
        assert_eq!(p["filename"], "été.txt");
        let (_, p) = parse_media_type("application/octet-stream").unwrap();
        assert!(p.is_empty());
        let (_, p) = parse_media_type("text/plain; charset=utf-8;").unwrap();
        assert_eq!(p["charset"], "utf-8");
        assert!(matches!(parse_media_type("").unwrap_err().1, MediaError::Type(_)));
        assert!(matches!(parse_media_type("a/b; x").unwrap_err(), (t, MediaError::Param(_)) if t == "a/b"));
        assert!(parse_media_type("a/b; x=1; x=2").is_err());
    }

    #[test]
    fn dispositions() {
        assert_eq!(disposition("a.txt"), "inline; filename=a.txt");
        assert_eq!(disposition("a b.txt"), "inline; filename=\"a b.txt\"");
        assert_eq!(disposition("q\"x"), "inline; filename=\"q\\\"x\"");
        assert_eq!(disposition("été.txt"), "inline; filename*=utf-8''%C3%A9t%C3%A9.txt");
    }

    #[test]
    fn content_encoding() {
        let mut h = HeaderMap::new();
        assert_eq!(request_gzip(&h), Ok(false));
        h.insert(hyper::header::CONTENT_ENCODING, "GZIP".parse().unwrap());
        assert_eq!(request_gzip(&h), Ok(true));
        h.insert(hyper::header::CONTENT_ENCODING, "br".parse().unwrap());
        assert!(request_gzip(&h).is_err());
    }
}
