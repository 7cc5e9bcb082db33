//! GET (and HEAD) /files?path=...&username=... (envd/internal/files/download.go):
//! the file is looked up and opened with the user's rights, then streamed
//! from a thread of its own through a bounded channel. Identity downloads
//! of regular files answer Range and conditional requests as Go's
//! http.ServeContent does; gzip ones are streamed whole.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::Method;
use tokio::sync::mpsc;

use super::encoding::{self, Coding};
use super::{authorize, fail, mime, named_user, unauthorized, Query};
use crate::error::Error;
use crate::http::{self, Request, Response};
use crate::log::civil_from_days;
use crate::state::State;
use crate::user;

const CHUNK: usize = 64 << 10;
/// What a response may hold whole instead of streaming it.
const SMALL: usize = 64 << 10;

/// gzip_all compresses a small body at once (BestSpeed, as every download).
fn gzip_all(b: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = z.write_all(b);
    z.finish().unwrap_or_default()
}

/// Opened is a file ready to serve.
struct Opened {
    file: File,
    size: u64,
    regular: bool,
    mtime: i64,
    /// By extension, else sniffed (seekable files only).
    content_type: Option<String>,
}

pub async fn download(st: Arc<State>, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    let m = parts.method.clone();
    let q = match Query::parse(parts.uri.query()) {
        Ok(q) => q,
        Err(e) => return fail(&st, &m, &e),
    };
    if let Err(e) = authorize(&st, &parts, &q, "read") {
        return unauthorized(&st, &m, &e);
    }
    let path = q.get("path");
    if path.is_empty() {
        return fail(
            &st,
            &m,
            &Error::invalid("invalid argument: path query parameter is required"),
        );
    }
    let u = match named_user(&st, q.get("username")) {
        Ok(u) => u,
        Err(e) => return fail(&st, &m, &e),
    };
    let resolved = match user::resolve_path(path, &u, &st.defaults().workdir) {
        Ok(p) => p,
        Err(e) => return fail(&st, &m, &e),
    };
    let r2 = resolved.clone();
    let opened = user::as_user(u.clone(), move || open(&r2)).await;
    let o = match opened {
        Ok(o) => o,
        Err(e) => return fail(&st, &m, &e),
    };
    let shown = resolved.display().to_string();
    if m == Method::GET {
        log!(st.log, Info, "file downloaded", "path" => shown, "user" => u.name, "size" => o.size);
    }

    let h = &parts.headers;
    let Some(mut coding) = encoding::negotiate(h) else {
        return not_acceptable(&st, &m, encoding::NOT_ACCEPTABLE);
    };
    let conditional = [
        "range",
        "if-range",
        "if-modified-since",
        "if-none-match",
        "if-match",
        "if-unmodified-since",
    ]
    .iter()
    .any(|n| h.get(*n).is_some_and(|v| !v.is_empty()));
    if conditional {
        if !encoding::identity_acceptable(h) {
            return not_acceptable(
                &st,
                &m,
                "identity encoding, required for Range and conditional requests, is not acceptable",
            );
        }
        coding = Coding::Identity;
    }
    // An empty file goes out unencoded with Content-Length: 0.
    if o.regular && o.size == 0 && encoding::identity_acceptable(h) {
        coding = Coding::Identity;
    }

    let name = resolved
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    let mut hdr = HeaderMap::new();
    hdr.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    hdr.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&encoding::disposition(&name)).unwrap_or(HeaderValue::from_static("inline")),
    );
    let seekable = o.regular && o.size > 0;
    if coding == Coding::Identity && seekable {
        return serve_content(&m, h, hdr, o);
    }

    set_content_type(&mut hdr, &o);
    if o.mtime != 0 {
        hdr.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_str(&http_date(o.mtime)).unwrap(),
        );
    }
    if coding == Coding::Gzip {
        hdr.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if m == Method::HEAD {
        return with_headers(http::status(200), hdr);
    }
    let gzip = coding == Coding::Gzip;
    let mut prefix = Vec::new();
    let mut file = o.file;
    if o.regular && (o.size == 0 || (gzip && o.size <= SMALL as u64)) {
        // Files that stat as empty may still have content (procfs, sysfs)
        // and small ones compress at once: what fits in SMALL goes out
        // whole with its Content-Length, as Go's buffered writer does.
        let read = user::blocking(move || {
            let mut buf = Vec::new();
            let r = (&file).take(SMALL as u64 + 1).read_to_end(&mut buf);
            Ok((file, buf, r))
        })
        .await;
        let Ok((f, buf, r)) = read else {
            return fail(&st, &m, &Error::internal("read the file"));
        };
        file = f;
        if r.is_ok() && buf.len() <= SMALL {
            let mut r = http::status(200);
            *r.body_mut() = http::full(if gzip { gzip_all(&buf) } else { buf });
            return with_headers(r, hdr);
        }
        prefix = buf;
    }
    let body = stream(st.clone(), shown, file, prefix, gzip);
    let mut r = http::status(200);
    *r.body_mut() = body;
    with_headers(r, hdr)
}

/// open stats path first (opening a FIFO would block until a writer shows
/// up) and opens it; runs as the user.
fn open(p: &Path) -> Result<Opened, Error> {
    let shown = p.display();
    let md = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::not_found(format!("path '{shown}' does not exist")));
        }
        Err(e) => return Err(Error::io(format!("stat {shown}"), e)),
    };
    let ft = md.file_type();
    if ft.is_dir() {
        return Err(Error::invalid(format!("path '{shown}' is a directory")));
    }
    if ft.is_fifo() || ft.is_socket() {
        return Err(Error::invalid(format!(
            "invalid argument: path \"{shown}\" is not a regular file"
        )));
    }
    let file = File::open(p).map_err(|e| Error::io(format!("open {shown}"), e))?;
    let regular = ft.is_file();
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut content_type = mime::by_extension(&name);
    if content_type.is_none() && regular && md.len() > 0 {
        let mut buf = [0u8; 512];
        let mut n = 0;
        while n < buf.len() {
            match file.read_at(&mut buf[n..], n as u64) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
        content_type = Some(mime::sniff(&buf[..n]).to_string());
    }
    Ok(Opened {
        size: md.len(),
        regular,
        mtime: md.mtime(),
        file,
        content_type,
    })
}

fn with_headers(mut r: Response, hdr: HeaderMap) -> Response {
    r.headers_mut().extend(hdr);
    r
}

fn not_acceptable(st: &State, m: &Method, msg: &str) -> Response {
    log!(st.log, Debug, "/files request not acceptable", "method" => m, "err" => msg);
    http::error_json(406, msg)
}

/// stream sends a file from offset (len bytes, or to its end) as the body,
/// gzipped or not, from a thread of its own.
fn stream(st: Arc<State>, path: String, file: File, prefix: Vec<u8>, gzip: bool) -> http::Body {
    let (tx, body) = http::channel(4);
    let spawned = std::thread::Builder::new().name("download".into()).spawn(move || {
        let sink = ChanWriter { tx };
        let r = if gzip {
            let mut z = flate2::write::GzEncoder::new(sink, flate2::Compression::fast());
            z.write_all(&prefix)
                .and_then(|_| copy(&file, 0, None, &mut z))
                .and_then(|_| z.finish().map(|_| ()))
        } else {
            let mut sink = sink;
            sink.write_all(&prefix).and_then(|_| copy(&file, 0, None, &mut sink))
        };
        if let Err(e) = r {
            log!(st.log, Debug, "download ended early", "path" => path, "err" => e);
        }
    });
    if spawned.is_err() {
        return http::empty();
    }
    body
}

fn copy(file: &File, mut offset: u64, len: Option<u64>, w: &mut dyn Write) -> io::Result<()> {
    let mut left = len.unwrap_or(u64::MAX);
    let mut buf = vec![0u8; CHUNK];
    let mut f = file;
    // Ranges are read with pread; a whole stream reads on (procfs, devices).
    let positioned = len.is_some() || offset > 0;
    while left > 0 {
        let want = (buf.len() as u64).min(left) as usize;
        let n = if positioned {
            file.read_at(&mut buf[..want], offset)?
        } else {
            f.read(&mut buf[..want])?
        };
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n])?;
        offset += n as u64;
        left -= n as u64;
    }
    w.flush()
}

/// ChanWriter writes into a body channel, waiting while the client reads
/// slowly; a gone client is a broken pipe.
struct ChanWriter {
    tx: mpsc::Sender<Bytes>,
}

impl Write for ChanWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if b.is_empty() {
            return Ok(0);
        }
        self.tx
            .blocking_send(Bytes::copy_from_slice(b))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "client went away"))?;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(PartialEq, Debug)]
enum Cond {
    None,
    True,
    False,
}

fn hget<'a>(h: &'a HeaderMap, n: &str) -> &'a str {
    h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// etag_list_cond answers If-Match / If-None-Match without an ETag of ours:
/// only "*" matches.
fn star_only(v: &str) -> bool {
    v.split(',').any(|e| e.trim() == "*")
}

/// serve_content is http.ServeContent for an open regular file.
fn serve_content(m: &Method, h: &HeaderMap, mut hdr: HeaderMap, o: Opened) -> Response {
    let mtime = o.mtime;
    hdr.insert(header::LAST_MODIFIED, HeaderValue::from_str(&http_date(mtime)).unwrap());
    let get_or_head = *m == Method::GET || *m == Method::HEAD;

    // Preconditions (RFC 9110 §13.2.2), without an ETag of ours.
    let mut ch = Cond::None;
    let im = hget(h, "if-match");
    if !im.is_empty() {
        ch = if star_only(im) { Cond::True } else { Cond::False };
    } else if let Some(t) = parse_http_date(hget(h, "if-unmodified-since")) {
        ch = if mtime <= t { Cond::True } else { Cond::False };
    }
    if ch == Cond::False {
        return with_headers(http::status(412), hdr);
    }
    let inm = hget(h, "if-none-match");
    let ch = if !inm.is_empty() {
        if star_only(inm) {
            Cond::False
        } else {
            Cond::True
        }
    } else if get_or_head {
        match parse_http_date(hget(h, "if-modified-since")) {
            Some(t) if mtime <= t => Cond::False,
            Some(_) => Cond::True,
            None => Cond::None,
        }
    } else {
        Cond::None
    };
    if ch == Cond::False {
        if get_or_head {
            hdr.remove(header::CONTENT_TYPE);
            return with_headers(http::status(304), hdr);
        }
        return with_headers(http::status(412), hdr);
    }
    let mut range = hget(h, "range").to_string();
    let ir = hget(h, "if-range");
    if !range.is_empty() && !ir.is_empty() && get_or_head {
        // No ETag of ours matches; a date must be the file's.
        if parse_http_date(ir) != Some(mtime) {
            range.clear();
        }
    }
    if !get_or_head {
        range.clear();
    }

    let ct = set_content_type(&mut hdr, &o);
    hdr.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let size = o.size;
    let (mut start, mut len, mut status) = (0u64, size, 200u16);
    if !range.is_empty() {
        match parse_range(&range, size) {
            Err(msg) => {
                if msg.ends_with("failed to overlap") {
                    hdr.insert(
                        header::CONTENT_RANGE,
                        HeaderValue::from_str(&format!("bytes */{size}")).unwrap(),
                    );
                }
                hdr.remove(header::ACCEPT_RANGES);
                let mut r = http::bytes(416, "text/plain; charset=utf-8", format!("{msg}\n"));
                r.headers_mut()
                    .insert("x-content-type-options", HeaderValue::from_static("nosniff"));
                hdr.remove(header::CONTENT_TYPE);
                return with_headers(r, hdr);
            }
            Ok(ranges) => {
                let sum: u64 = ranges.iter().map(|r| r.1).sum();
                // Ranges adding up to more than the file are ignored: it comes whole.
                if ranges.len() == 1 && sum <= size {
                    (start, len, status) = (ranges[0].0, ranges[0].1, 206);
                    hdr.insert(
                        header::CONTENT_RANGE,
                        HeaderValue::from_str(&format!("bytes {}-{}/{}", start, start + len - 1, size)).unwrap(),
                    );
                } else if ranges.len() > 1 && sum <= size {
                    let (ctype, pieces) = byteranges(&ranges, &ct, size);
                    let total: u64 = pieces.iter().map(Piece::len).sum();
                    hdr.insert(header::CONTENT_TYPE, HeaderValue::from_str(&ctype).unwrap());
                    hdr.insert(header::CONTENT_LENGTH, HeaderValue::from(total));
                    let mut r = http::status(206);
                    if *m != Method::HEAD {
                        *r.body_mut() = stream_pieces(o.file, pieces);
                    }
                    return with_headers(r, hdr);
                }
            }
        }
    }
    hdr.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let mut r = http::status(status);
    if *m != Method::HEAD && len > 0 {
        *r.body_mut() = stream_pieces(o.file, vec![Piece::Range(start, len)]);
    }
    with_headers(r, hdr)
}

/// Piece is a part of a ranged answer: literal bytes or a range of the file.
enum Piece {
    Bytes(Vec<u8>),
    Range(u64, u64),
}

impl Piece {
    fn len(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::Range(_, n) => *n,
        }
    }
}

/// byteranges lays out a multipart/byteranges answer as Go's ServeContent
/// does (mime/multipart's writer, a random 60-hex-digit boundary): its
/// Content-Type and its pieces.
fn byteranges(ranges: &[(u64, u64)], ctype: &str, size: u64) -> (String, Vec<Piece>) {
    let mut rnd = [0u8; 30];
    // SAFETY: getrandom writes at most rnd.len() bytes into rnd.
    unsafe { libc::getrandom(rnd.as_mut_ptr().cast(), rnd.len(), 0) };
    let boundary: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
    let mut pieces = Vec::new();
    for (i, (start, len)) in ranges.iter().enumerate() {
        let sep = if i == 0 { "" } else { "\r\n" };
        let head = format!(
            "{sep}--{boundary}\r\nContent-Range: bytes {}-{}/{size}\r\nContent-Type: {ctype}\r\n\r\n",
            start,
            start + len - 1
        );
        pieces.push(Piece::Bytes(head.into_bytes()));
        pieces.push(Piece::Range(*start, *len));
    }
    pieces.push(Piece::Bytes(format!("\r\n--{boundary}--\r\n").into_bytes()));
    (format!("multipart/byteranges; boundary={boundary}"), pieces)
}

/// stream_pieces sends the pieces from a thread of its own.
fn stream_pieces(file: File, pieces: Vec<Piece>) -> http::Body {
    let (tx, body) = http::channel(4);
    let _ = std::thread::Builder::new().name("download".into()).spawn(move || {
        let mut w = ChanWriter { tx };
        for p in pieces {
            let r = match p {
                Piece::Bytes(b) => w.write_all(&b),
                Piece::Range(start, len) => copy(&file, start, Some(len), &mut w),
            };
            if r.is_err() {
                return;
            }
        }
    });
    body
}

/// parse_range is Go's parseRange: (start, length) pairs, or the message
/// of a 416.
fn parse_range(s: &str, size: u64) -> Result<Vec<(u64, u64)>, String> {
    let invalid = || "invalid range".to_string();
    let Some(spec) = s.strip_prefix("bytes=") else {
        return Err(invalid());
    };
    let mut out = Vec::new();
    let mut no_overlap = false;
    for ra in spec.split(',') {
        let ra = ra.trim_matches(|c| c == ' ' || c == '\t');
        if ra.is_empty() {
            continue;
        }
        let Some((a, b)) = ra.split_once('-') else {
            return Err(invalid());
        };
        let (a, b) = (
            a.trim_matches(|c| c == ' ' || c == '\t'),
            b.trim_matches(|c| c == ' ' || c == '\t'),
        );
        if a.is_empty() {
            if b.is_empty() || b.starts_with('-') {
                return Err(invalid());
            }
            let mut n: u64 = b.parse().map_err(|_| invalid())?;
            if n > size {
                n = size;
            }
            out.push((size - n, n));
        } else {
            let i: u64 = a.parse().map_err(|_| invalid())?;
            if i >= size {
                no_overlap = true;
                continue;
            }
            let len = if b.is_empty() {
                size - i
            } else {
                let mut e: u64 = b.parse().map_err(|_| invalid())?;
                if i > e {
                    return Err(invalid());
                }
                if e >= size {
                    e = size - 1;
                }
                e - i + 1
            };
            out.push((i, len));
        }
    }
    if no_overlap && out.is_empty() {
        return Err("invalid range: failed to overlap".into());
    }
    Ok(out)
}

/// set_content_type gives the answer the file's content type, sniffed or
/// by its extension, else application/octet-stream, and returns it.
fn set_content_type(hdr: &mut HeaderMap, o: &Opened) -> String {
    let ct = o
        .content_type
        .clone()
        .unwrap_or_else(|| "application/octet-stream".into());
    if let Ok(v) = HeaderValue::from_str(&ct) {
        hdr.insert(header::CONTENT_TYPE, v);
    }
    ct
}

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// http_date is http.TimeFormat: "Mon, 02 Jan 2006 15:04:05 GMT".
fn http_date(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        DAYS[days.rem_euclid(7) as usize],
        d,
        MONTHS[m as usize - 1],
        y,
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// parse_http_date reads the IMF-fixdate form (the one clients send).
fn parse_http_date(s: &str) -> Option<i64> {
    let s = s.trim();
    let (_, rest) = s.split_once(", ")?;
    let f: Vec<&str> = rest.split(' ').collect();
    if f.len() != 5 || f[4] != "GMT" {
        return None;
    }
    let d: u32 = f[0].parse().ok()?;
    let m = MONTHS.iter().position(|x| *x == f[1])? as u32 + 1;
    let y: i64 = f[2].parse().ok()?;
    let t: Vec<i64> = f[3].split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if t.len() != 3 || d == 0 || d > 31 || t[0] > 23 || t[1] > 59 || t[2] > 60 {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400 + t[0] * 3600 + t[1] * 60 + t[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(1_136_214_245), "Mon, 02 Jan 2006 15:04:05 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        for t in [0, 1_136_214_245, 951_782_400, 1_796_083_199] {
            assert_eq!(parse_http_date(&http_date(t)), Some(t));
        }
        assert_eq!(parse_http_date("garbage"), None);
        assert_eq!(parse_http_date(""), None);
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=10-19", 100), Ok(vec![(10, 10)]));
        assert_eq!(parse_range("bytes=90-", 100), Ok(vec![(90, 10)]));
        assert_eq!(parse_range("bytes=-5", 100), Ok(vec![(95, 5)]));
        assert_eq!(parse_range("bytes=-500", 100), Ok(vec![(0, 100)]));
        assert_eq!(parse_range("bytes=50-500", 100), Ok(vec![(50, 50)]));
        assert_eq!(parse_range("bytes=0-1, 5-6", 100), Ok(vec![(0, 2), (5, 2)]));
        assert_eq!(
            parse_range("bytes=100-", 100),
            Err("invalid range: failed to overlap".into())
        );
        assert_eq!(parse_range("bytes=100-, 1-2", 100), Ok(vec![(1, 2)]));
        assert_eq!(parse_range("bytes=5-4", 100), Err("invalid range".into()));
        assert_eq!(parse_range("items=1-2", 100), Err("invalid range".into()));
        assert_eq!(parse_range("bytes=x-2", 100), Err("invalid range".into()));
    }
}
