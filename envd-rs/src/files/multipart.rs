//! A streaming multipart/form-data reader over any `Read` (the request
//! body, gunzipped when it came gzip), in the manner of Go's
//! mime/multipart: parts are read one at a time, each body straight from
//! the stream through a small buffer, so an upload of any size takes
//! constant memory.

use std::io::{self, Read};

/// The most a preamble line, a header line or a part's headers may take.
const MAX_LINE: usize = 64 << 10;
const MAX_HEADERS: usize = 1 << 20;
const READ_CHUNK: usize = 64 << 10;

pub struct Reader<R: Read> {
    r: R,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    dash_boundary: Vec<u8>,
    nl: Vec<u8>,
    nl_dash_boundary: Vec<u8>,
    parts_read: usize,
    in_part: bool,
    done: bool,
}

/// Part headers: (lower-cased name, value) in order.
pub struct Headers(Vec<(String, String)>);

impl Headers {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn is_lwsp(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

fn skip_lwsp(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| is_lwsp(**c)).count();
    &b[n..]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    // Jump between candidates by their first byte (a line break, rare in
    // most data) rather than comparing at every offset.
    while let Some(i) = hay[from..].iter().position(|&c| c == first) {
        let at = from + i;
        if hay.len() - at < needle.len() {
            return None;
        }
        if &hay[at + 1..at + needle.len()] == rest {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

impl<R: Read> Reader<R> {
    pub fn new(r: R, boundary: &str) -> Reader<R> {
        let dash_boundary = format!("--{boundary}").into_bytes();
        let mut nl_dash_boundary = b"\r\n".to_vec();
        nl_dash_boundary.extend_from_slice(&dash_boundary);
        Reader {
            r,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            dash_boundary,
            nl: b"\r\n".to_vec(),
            nl_dash_boundary,
            parts_read: 0,
            in_part: false,
            done: false,
        }
    }

    fn avail(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// fill reads more of the stream; false at its end.
    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + READ_CHUNK, 0);
        loop {
            match self.r.read(&mut self.buf[old..]) {
                Ok(0) => {
                    self.buf.truncate(old);
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.buf.truncate(old + n);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e);
                }
            }
        }
    }

    /// read_line takes a line with its '\n' (or what is left at the end).
    fn read_line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.avail().iter().position(|&c| c == b'\n') {
                let line = self.avail()[..=i].to_vec();
                self.pos += i + 1;
                return Ok(line);
            }
            if self.avail().len() > MAX_LINE {
                return Err(err("multipart: NextPart: bufio: buffer full"));
            }
            if !self.fill()? {
                let line = self.avail().to_vec();
                self.pos = self.buf.len();
                return Ok(line);
            }
        }
    }

    fn is_final_boundary(&self, line: &[u8]) -> bool {
        let Some(rest) = line.strip_prefix(self.dash_boundary.as_slice()) else {
            return false;
        };
        let Some(rest) = rest.strip_prefix(b"--") else {
            return false;
        };
        let rest = skip_lwsp(rest);
        rest.is_empty() || rest == self.nl.as_slice()
    }

    fn is_boundary_delimiter_line(&mut self, line: &[u8]) -> bool {
        let Some(rest) = line.strip_prefix(self.dash_boundary.as_slice()) else {
            return false;
        };
        let rest = skip_lwsp(rest);
        // The first boundary line says whether lines end in "\n" alone.
        if self.parts_read == 0 && rest == b"\n" {
            self.nl = b"\n".to_vec();
            let mut ndb = b"\n".to_vec();
            ndb.extend_from_slice(&self.dash_boundary);
            self.nl_dash_boundary = ndb;
        }
        rest == self.nl.as_slice()
    }

    /// next_part skips what is left of the current part and reads the next
    /// one's headers; None after the final boundary.
    pub fn next_part(&mut self) -> io::Result<Option<Headers>> {
        if self.done {
            return Ok(None);
        }
        if self.in_part {
            let mut sink = [0u8; 8192];
            while self.read_part(&mut sink)? > 0 {}
            self.in_part = false;
        }
        let mut expect_new_part = false;
        loop {
            let at_end_before = self.eof && self.avail().is_empty();
            let line = self.read_line()?;
            let at_end = self.eof && self.avail().is_empty();
            if at_end && self.is_final_boundary(&line) {
                self.done = true;
                return Ok(None);
            }
            if at_end_before || (at_end && !line.ends_with(b"\n")) {
                return Err(err("multipart: NextPart: EOF"));
            }
            if self.is_boundary_delimiter_line(&line) {
                self.parts_read += 1;
                // A body that ends within a part's headers ends the parts, as
                // in Go (whose NextPart then answers a bare io.EOF).
                let Some(h) = self.read_headers()? else {
                    self.done = true;
                    return Ok(None);
                };
                self.in_part = true;
                return Ok(Some(h));
            }
            if self.is_final_boundary(&line) {
                self.done = true;
                return Ok(None);
            }
            if expect_new_part {
                return Err(err(format!(
                    "multipart: expecting a new Part; got line {:?}",
                    String::from_utf8_lossy(&line)
                )));
            }
            if self.parts_read == 0 {
                continue; // the preamble
            }
            // The line break between the previous part's body and the boundary.
            if line == self.nl {
                expect_new_part = true;
                continue;
            }
            return Err(err(format!(
                "multipart: unexpected line in Next(): {:?}",
                String::from_utf8_lossy(&line)
            )));
        }
    }

    fn read_headers(&mut self) -> io::Result<Option<Headers>> {
        let mut h: Vec<(String, String)> = Vec::new();
        let mut total = 0;
        loop {
            let line = self.read_line()?;
            if line.is_empty() || !line.ends_with(b"\n") {
                return Ok(None);
            }
            total += line.len();
            if total > MAX_HEADERS {
                return Err(err("multipart: NextPart: message too large"));
            }
            let l = line.strip_suffix(b"\n").unwrap_or(&line);
            let l = l.strip_suffix(b"\r").unwrap_or(l);
            if l.is_empty() {
                return Ok(Some(Headers(h)));
            }
            let s = String::from_utf8_lossy(l);
            if is_lwsp(l[0]) {
                if let Some(last) = h.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(s.trim());
                    continue;
                }
            }
            let Some((k, v)) = s.split_once(':') else {
                return Err(err(format!("multipart: NextPart: malformed MIME header line: {s}")));
            };
            if k.is_empty() || k.bytes().any(|c| c <= b' ' || c >= 0x7f) {
                return Err(err(format!("multipart: NextPart: malformed MIME header line: {s}")));
            }
            h.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
    }

    /// read_part reads the current part's body; 0 at its end.
    pub fn read_part(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if !self.in_part || out.is_empty() {
            return Ok(0);
        }
        loop {
            let ndb_len = self.nl_dash_boundary.len();
            let avail = self.avail();
            let mut emit = None;
            match find(avail, &self.nl_dash_boundary) {
                Some(i) => {
                    // What follows decides (Go's matchAfterPrefix): a line
                    // end, blanks or "--" end the part; a lone "-" needs one
                    // more byte; anything else is data.
                    let after = match (avail.get(i + ndb_len).copied(), avail.get(i + ndb_len + 1).copied()) {
                        (Some(b'-'), Some(b'-')) => Some(true),
                        (Some(b'-'), None) if !self.eof => None,
                        (Some(b'-'), _) => Some(false),
                        (Some(c), _) => Some(c == b'\r' || c == b'\n' || is_lwsp(c)),
                        (None, _) => None,
                    };
                    match after {
                        Some(true) => {
                            if i == 0 {
                                return Ok(0);
                            }
                            emit = Some(i);
                        }
                        Some(false) => emit = Some(i + 1), // the boundary's text inside data
                        None if self.eof => {
                            if i == 0 {
                                return Ok(0);
                            }
                            emit = Some(i);
                        }
                        None if i > 0 => emit = Some(i),
                        None => {}
                    }
                }
                None => {
                    // Keep what could be the start of a delimiter.
                    let keep = (1..ndb_len.min(avail.len() + 1))
                        .rev()
                        .find(|&k| avail.ends_with(&self.nl_dash_boundary[..k]))
                        .unwrap_or(0);
                    if avail.len() > keep {
                        emit = Some(avail.len() - keep);
                    } else if self.eof {
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected EOF"));
                    }
                }
            }
            if let Some(n) = emit {
                let n = n.min(out.len());
                out[..n].copy_from_slice(&self.avail()[..n]);
                self.pos += n;
                return Ok(n);
            }
            if !self.fill()? && self.avail().is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected EOF"));
            }
        }
    }
}

/// Part reads the current part's body as a `Read`.
pub struct Part<'a, R: Read>(pub &'a mut Reader<R>);

impl<R: Read> Read for Part<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.0.read_part(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most n bytes per read, to cut the
    /// stream at every possible place.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(self.1).min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn parse(body: &[u8], boundary: &str, chunk: usize) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut r = Reader::new(Trickle(body, chunk), boundary);
        let mut out = Vec::new();
        while let Some(h) = r.next_part()? {
            let mut data = Vec::new();
            Part(&mut r).read_to_end(&mut data)?;
            out.push((h.get("Content-Disposition").unwrap_or("").to_string(), data));
        }
        Ok(out)
    }

    #[test]
    fn parts() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nhello\r\n--XyZ-not\r\n\r\n--XyZ \r\ncontent-disposition: form-data; name=\"file\"; filename=\"b\"\r\nX: 1\r\n\r\n\r\n--XyZ\r\nContent-Disposition: form-data; name=\"e\"\r\n\r\nlast\r\n--XyZ--\r\nepilogue";
        for chunk in [1, 2, 3, 5, 7, 64, 100000] {
            let got = parse(body, "XyZ", chunk).unwrap();
            assert_eq!(got.len(), 3, "chunk {chunk}");
            assert_eq!(got[0].0, "form-data; name=\"file\"; filename=\"a\"");
            assert_eq!(got[0].1, b"hello\r\n--XyZ-not\r\n".to_vec(), "chunk {chunk}");
            assert_eq!(got[1].1, b"".to_vec());
            assert_eq!(got[2].1, b"last".to_vec());
        }
    }

    #[test]
    fn lf_only_and_skipped_parts() {
        let body = b"--b\nContent-Disposition: x\n\nskip me\n--b\nContent-Disposition: y\n\ndata\n--b--\n";
        for chunk in [1, 4, 1000] {
            let mut r = Reader::new(Trickle(body, chunk), "b");
            assert_eq!(r.next_part().unwrap().unwrap().get("content-disposition"), Some("x"));
            let h = r.next_part().unwrap().unwrap();
            assert_eq!(h.get("Content-Disposition"), Some("y"));
            let mut d = Vec::new();
            Part(&mut r).read_to_end(&mut d).unwrap();
            assert_eq!(d, b"data");
            assert!(r.next_part().unwrap().is_none());
            assert!(r.next_part().unwrap().is_none());
        }
    }

    #[test]
    fn finding() {
        assert_eq!(find(b"abc\r\n--b", b"\r\n--b"), Some(3));
        assert_eq!(find(b"\r\r\n--b", b"\r\n--b"), Some(1));
        assert_eq!(find(b"abc\r\n--", b"\r\n--b"), None);
        assert_eq!(find(b"", b"x"), None);
        assert_eq!(find(b"x", b""), None);
    }

    #[test]
    fn truncated() {
        let body = b"--b\r\nContent-Disposition: x\r\n\r\nsome data without an end";
        let mut r = Reader::new(Trickle(body, 3), "b");
        r.next_part().unwrap().unwrap();
        let mut d = Vec::new();
        let e = Part(&mut r).read_to_end(&mut d).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(parse(b"", "b", 10).is_err());
        assert!(parse(b"--b\r\nContent-Disposition: x\r\n", "b", 10).unwrap().is_empty());
        assert!(parse(b"--b--", "b", 10).unwrap().is_empty());
    }
}
