//! POST /files?path=...&username=... (envd/internal/files/upload.go and
//! write.go). The body is fed from the event loop through a bounded
//! channel to a thread running as the user, which gunzips it when it came
//! gzip, splits multipart bodies, and writes each file straight from the
//! stream, so memory stays constant whatever the upload's size.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::HeaderMap;
use serde::Serialize;
use tokio::sync::mpsc;

use super::encoding::{self, MediaError};
use super::metadata::{self, Metadata};
use super::multipart;
use super::{authorize, fail, named_user, unauthorized, Query};
use crate::error::Error;
use crate::http::{self, Request, Response};
use crate::state::State;
use crate::user::{self, User};

const COPY_BUF: usize = 256 << 10;
const METADATA_HEADER_PREFIX: &str = "x-metadata-";

/// Entry is one written file of the answer.
#[derive(Serialize, Debug)]
struct Entry {
    path: String,
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata>,
}

pub async fn upload(st: Arc<State>, req: Request) -> Response {
    let (parts, mut body) = req.into_parts();
    let resp = upload_body(st, &parts, &mut body).await;
    http::finish_unread(&parts, &mut body, resp).await
}

async fn upload_body(st: Arc<State>, parts: &Parts, body: &mut Incoming) -> Response {
    let m = parts.method.clone();
    let q = match Query::parse(parts.uri.query()) {
        Ok(q) => q,
        Err(e) => return fail(&st, &m, &e),
    };
    if let Err(e) = authorize(&st, parts, &q, "write") {
        return unauthorized(&st, &m, &e);
    }
    let u = match named_user(&st, q.get("username")) {
        Ok(u) => u,
        Err(e) => return fail(&st, &m, &e),
    };
    let meta = match metadata_from_headers(&parts.headers) {
        Ok(v) => v,
        Err(e) => return fail(&st, &m, &e),
    };
    let ct = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let ct = ct.unwrap_or_default();
    let (media_type, params) = match encoding::parse_media_type(&ct) {
        Ok(v) => v,
        Err((t, MediaError::Param(_))) => (t, Default::default()),
        Err(_) => (String::new(), Default::default()),
    };
    let gzip = match encoding::request_gzip(&parts.headers) {
        Ok(g) => g,
        Err(msg) => return fail(&st, &m, &Error::invalid(msg)),
    };

    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
    let job = Job {
        st: st.clone(),
        user: u.clone(),
        workdir: st.defaults().workdir,
        path: q.get("path").to_string(),
        meta,
    };
    let boundary = params.get("boundary").cloned().unwrap_or_default();
    let work = user::as_user(u, move || {
        let src = body_reader(
            ChannelReader {
                rx,
                cur: Bytes::new(),
                failed: None,
            },
            gzip,
        )?;
        match media_type.as_str() {
            "application/octet-stream" => job.raw(src),
            "multipart/form-data" | "multipart/mixed" => job.multipart(&boundary, src),
            _ => Err(Error::invalid(format!(
                "invalid argument: unsupported Content-Type {ct:?}, expected multipart/form-data or application/octet-stream"
            ))),
        }
    });
    let res = {
        let feeder = feed(body, tx);
        tokio::pin!(work, feeder);
        let mut fed = false;
        loop {
            tokio::select! {
                r = &mut work => break r,
                _ = &mut feeder, if !fed => fed = true,
            }
        }
    };
    match res {
        Ok(entries) => http::json(200, &entries),
        Err(e) => fail(&st, &m, &e),
    }
}

/// feed passes the request body's data to the writing thread; it ends at
/// the body's end, or when the thread stopped reading.
async fn feed(body: &mut Incoming, tx: mpsc::Sender<io::Result<Bytes>>) {
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    if !d.is_empty() && tx.send(Ok(d)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                return;
            }
        }
    }
}

/// ChannelReader reads the fed body on the writing thread.
struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    cur: Bytes,
    failed: Option<io::Error>,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let mut n = 0;
        // Fill out with what has arrived already: fewer, larger writes.
        loop {
            let k = self.cur.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&self.cur[..k]);
            let _ = self.cur.split_to(k);
            n += k;
            if n == out.len() {
                return Ok(n);
            }
            match self.rx.try_recv() {
                Ok(Ok(b)) => self.cur = b,
                Ok(Err(e)) => {
                    // Report the data first; the error comes with the next read.
                    self.failed = Some(e);
                    return Ok(n);
                }
                Err(_) => return Ok(n),
            }
        }
    }
}

/// body_reader removes a gzip Content-Encoding; a body that is not gzip
/// fails here, before any file is touched.
fn body_reader(mut r: ChannelReader, gzip: bool) -> Result<Box<dyn Read>, Error> {
    if !gzip {
        return Ok(Box::new(r));
    }
    // gzip.NewReader reads the 10-byte header at once.
    let mut head = [0u8; 10];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(Error::invalid(format!("invalid argument: gzip request body: {e}"))),
        }
    }
    if n == 0 {
        return Err(Error::invalid("invalid argument: gzip request body: EOF"));
    }
    if n < head.len() {
        return Err(Error::invalid("invalid argument: gzip request body: unexpected EOF"));
    }
    if head[..3] != [0x1f, 0x8b, 8] {
        return Err(Error::invalid(
            "invalid argument: gzip request body: gzip: invalid header",
        ));
    }
    let src = io::Cursor::new(head.to_vec()).chain(r);
    Ok(Box::new(flate2::read::MultiGzDecoder::new(src)))
}

/// metadata_from_headers collects `X-Metadata-<key>` headers (key
/// lower-cased, first value wins) and validates them.
fn metadata_from_headers(h: &HeaderMap) -> Result<Option<Metadata>, Error> {
    let mut m: Option<Metadata> = None;
    for name in h.keys() {
        let n = name.as_str();
        if n.len() <= METADATA_HEADER_PREFIX.len() || !n.starts_with(METADATA_HEADER_PREFIX) {
            continue;
        }
        let Some(v) = h.get(name) else { continue };
        let key = n[METADATA_HEADER_PREFIX.len()..].to_ascii_lowercase();
        m.get_or_insert_with(Metadata::new)
            .insert(key, String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    if let Some(m) = &m {
        metadata::validate(m)?;
    }
    Ok(m)
}

/// Job is one upload, run on the user's thread.
struct Job {
    st: Arc<State>,
    user: Arc<User>,
    workdir: String,
    path: String,
    meta: Option<Metadata>,
}

impl Job {
    fn raw(&self, mut body: Box<dyn Read>) -> Result<Vec<Entry>, Error> {
        if self.path.is_empty() {
            return Err(Error::invalid(
                "invalid argument: path query parameter is required for an application/octet-stream upload",
            ));
        }
        let resolved = user::resolve_path(&self.path, &self.user, &self.workdir)?;
        let mut w = Writer::new(self);
        let mut src = Counter { r: &mut body, n: 0 };
        let written = w.write(&resolved, &mut src)?;
        self.uploaded(&resolved, src.n);
        Ok(vec![self.entry_for(&resolved, &written)])
    }

    fn multipart(&self, boundary: &str, body: Box<dyn Read>) -> Result<Vec<Entry>, Error> {
        if boundary.is_empty() {
            return Err(Error::invalid(
                "invalid argument: multipart Content-Type has no boundary",
            ));
        }
        let mut mr = multipart::Reader::new(body, boundary);
        let mut w = Writer::new(self);
        let mut entries = Vec::new();
        let mut seen: Vec<PathBuf> = Vec::new();
        loop {
            let h = match mr.next_part() {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => return Err(Error::invalid(format!("invalid argument: reading multipart body: {e}"))),
            };
            let Some(resolved) = self.part_target(&h)? else {
                continue;
            };
            if seen.contains(&resolved) {
                return Err(Error::invalid(format!(
                    "invalid argument: cannot upload multiple files to the same path {:?} in one request; the files before it were written",
                    resolved.display().to_string()
                )));
            }
            seen.push(resolved.clone());
            let mut part = multipart::Part(&mut mr);
            let mut src = Counter { r: &mut part, n: 0 };
            let written = w.write(&resolved, &mut src)?;
            self.uploaded(&resolved, src.n);
            entries.push(self.entry_for(&resolved, &written));
        }
        if entries.is_empty() {
            return Err(Error::invalid(
                "invalid argument: multipart body has no part named \"file\"",
            ));
        }
        Ok(entries)
    }

    /// part_target is where a part goes: the `path` query when given, else
    /// the part's filename verbatim (the SDKs put whole paths there); None
    /// for a part that is not a file.
    fn part_target(&self, h: &multipart::Headers) -> Result<Option<PathBuf>, Error> {
        let Some(cd) = h.get("content-disposition").filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let (disposition, params) = encoding::parse_media_type(cd).map_err(|(_, e)| {
            Error::invalid(format!(
                "invalid argument: part Content-Disposition {cd:?}: {}",
                e.message()
            ))
        })?;
        if disposition != "form-data" || params.get("name").map(String::as_str) != Some("file") {
            return Ok(None);
        }
        let mut path = self.path.as_str();
        if path.is_empty() {
            path = params.get("filename").map(String::as_str).unwrap_or("");
            if path.is_empty() {
                return Err(Error::invalid(
                    "invalid argument: file part has no filename and no path query parameter was given",
                ));
            }
        }
        user::resolve_path(path, &self.user, &self.workdir).map(Some)
    }

    /// entry_for describes the file written for path (at written, which
    /// differs when path is a symlink), with the metadata read back.
    fn entry_for(&self, path: &Path, written: &Path) -> Entry {
        let m = match metadata::read(written) {
            Ok(m) => m,
            Err(e) => {
                log!(self.st.log, Warn, "reading back metadata of uploaded file", "path" => written.display(), "err" => e);
                Metadata::new()
            }
        };
        Entry {
            path: path.display().to_string(),
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "/".into()),
            kind: "file",
            metadata: if m.is_empty() { None } else { Some(m) },
        }
    }

    fn uploaded(&self, path: &Path, size: u64) {
        log!(self.st.log, Info, "file uploaded", "path" => path.display(), "user" => self.user.name, "size" => size);
    }
}

/// Counter counts the bytes read through it.
struct Counter<'a> {
    r: &'a mut dyn Read,
    n: u64,
}

impl Read for Counter<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.r.read(out)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// Writer stores uploaded files for one user through one buffer.
struct Writer<'a> {
    job: &'a Job,
    buf: Vec<u8>,
}

fn is_dir_error(path: &Path) -> Error {
    Error::invalid(format!("path is a directory: {}", path.display()))
}

impl<'a> Writer<'a> {
    fn new(job: &'a Job) -> Writer<'a> {
        Writer {
            job,
            buf: vec![0u8; COPY_BUF],
        }
    }

    /// write stores src at path and returns the file it wrote: path itself,
    /// or what a symlink at path points to. Files are written in place
    /// (truncated, then rewritten), as E2B's envd does, so an overwritten
    /// file keeps its inode and owner; a failed upload of a new file
    /// removes it.
    fn write(&mut self, path: &Path, src: &mut dyn Read) -> Result<PathBuf, Error> {
        let u = &self.job.user;
        if let Some(parent) = path.parent() {
            user::ensure_dir(parent, u)?;
        }
        let shown = path.display();
        let mut target = path.to_path_buf();
        let mut fi = match std::fs::symlink_metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(format!("lstat {shown}"), e)),
        };
        if fi.as_ref().is_some_and(|m| m.file_type().is_symlink()) {
            match std::fs::canonicalize(path) {
                Ok(real) => {
                    fi = Some(std::fs::metadata(&real).map_err(|e| Error::io(format!("stat {}", real.display()), e))?);
                    target = real;
                }
                Err(_) => {
                    // A dangling link: replace the link itself with the file.
                    std::fs::remove_file(path).map_err(|e| Error::io(format!("remove {shown}"), e))?;
                    fi = None;
                }
            }
        }
        if let Some(m) = fi {
            let ft = m.file_type();
            if ft.is_dir() {
                return Err(is_dir_error(path));
            }
            if ft.is_char_device() {
                // /dev/null and friends: write to the device, never chown it.
                self.write_in_place(&target, src, false)?;
                return Ok(target);
            }
            if !ft.is_file() {
                return Err(Error::invalid(format!(
                    "invalid argument: path \"{shown}\" is not a regular file"
                )));
            }
            self.write_in_place(&target, src, true)?;
            return Ok(target);
        }

        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target);
        let f = match f {
            Ok(f) => f,
            // Created by someone else since we looked: overwrite it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return self.write(path, src),
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => return Err(is_dir_error(path)),
            Err(e) => return Err(Error::io(format!("open {}", target.display()), e)),
        };
        let r = (|| {
            std::os::unix::fs::fchown(&f, Some(u.uid), Some(u.gid))
                .map_err(|e| Error::io(format!("chown {shown}"), e))?;
            self.copy(&f, &target, src)?;
            self.set_metadata(&target)?;
            close(f, &target)
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&target);
        }
        r.map(|_| target)
    }

    fn write_in_place(&mut self, path: &Path, src: &mut dyn Read, chown: bool) -> Result<(), Error> {
        let f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let u = &self.job.user;
        if chown {
            // Best effort: pseudo filesystems may refuse it.
            if let Err(e) = std::os::unix::fs::fchown(&f, Some(u.uid), Some(u.gid)) {
                log!(self.job.st.log, Debug, "chown after in-place write failed", "path" => path.display(), "err" => e);
            }
        }
        self.copy(&f, path, src)?;
        if chown {
            if let Err(e) = self.set_metadata(path) {
                if self.job.meta.as_ref().is_some_and(|m| !m.is_empty()) {
                    return Err(e);
                }
                log!(self.job.st.log, Debug, "clearing metadata after in-place write failed", "path" => path.display(), "err" => e.message);
            }
        }
        close(f, path)
    }

    /// copy streams src into f. A failure to read the request is the
    /// client's (400); a failure to write keeps its errno (ENOSPC is 507).
    fn copy(&mut self, mut f: &File, path: &Path, src: &mut dyn Read) -> Result<(), Error> {
        loop {
            let n = match src.read(&mut self.buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::invalid(format!("invalid argument: reading upload: {e}"))),
            };
            f.write_all(&self.buf[..n])
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        }
    }

    /// set_metadata replaces the file's metadata with the request's (none
    /// clears it); a filesystem without user xattrs keeps none.
    fn set_metadata(&self, path: &Path) -> Result<(), Error> {
        let empty = Metadata::new();
        let m = self.job.meta.as_ref().unwrap_or(&empty);
        match metadata::replace(path, m) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                if !m.is_empty() {
                    log!(self.job.st.log, Warn, "filesystem does not support xattrs; metadata not stored", "path" => path.display());
                }
                Ok(())
            }
            Err(e) => Err(Error::io(format!("set metadata of {}", path.display()), e)),
        }
    }
}

/// close closes f and reports a deferred write error (ENOSPC, EDQUOT).
fn close(f: File, path: &Path) -> Result<(), Error> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: fd is ours, taken out of the File, and closed once.
    if unsafe { libc::close(fd) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::io(format!("write {}", path.display()), e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_headers() {
        let mut h = HeaderMap::new();
        assert!(metadata_from_headers(&h).unwrap().is_none());
        h.insert("x-metadata-Owner", "me".parse().unwrap());
        h.append("x-metadata-owner", "second".parse().unwrap());
        h.insert("x-metadata-", "ignored".parse().unwrap());
        let m = metadata_from_headers(&h).unwrap().unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m["owner"], "me");
    }

    fn job(dir: &Path, meta: Option<Metadata>) -> Job {
        use crate::log::{Level, Logger};
        use crate::state::Config;
        let cfg = Config {
            default_user: "root".into(),
            workdir: String::new(),
            disk_path: "/".into(),
            cgroup_root: None,
            pids_reserve: 0,
        };
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let user = User {
            name: "me".into(),
            uid,
            gid,
            groups: vec![gid],
            home: dir.display().to_string(),
        };
        Job {
            st: State::new(Logger::new(Level::Error), cfg),
            user: Arc::new(user),
            workdir: String::new(),
            path: String::new(),
            meta,
        }
    }

    #[test]
    fn writes() {
        let dir = std::env::temp_dir().join(format!("envd-rs-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let j = job(&dir, None);
        let mut w = Writer::new(&j);
        // A new file below missing directories.
        let p = dir.join("a/b/c.txt");
        assert_eq!(w.write(&p, &mut &b"one"[..]).unwrap(), p);
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        // Overwritten in place: the same inode, shorter content.
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
        w.write(&p, &mut &b"2"[..]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"2");
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap()),
            ino
        );
        // Through a symlink to the file it points at.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert_eq!(w.write(&link, &mut &b"via"[..]).unwrap(), p);
        assert_eq!(std::fs::read(&p).unwrap(), b"via");
        // A dangling link is replaced by the file.
        let dl = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("nowhere"), &dl).unwrap();
        assert_eq!(w.write(&dl, &mut &b"d"[..]).unwrap(), dl);
        assert!(std::fs::symlink_metadata(&dl).unwrap().file_type().is_file());
        // Onto a directory, and below a file.
        let e = w.write(&dir.join("a"), &mut &b"x"[..]).unwrap_err();
        assert_eq!(
            (e.http_status(), e.message.starts_with("path is a directory")),
            (400, true)
        );
        assert_eq!(w.write(&p.join("x"), &mut &b"x"[..]).unwrap_err().http_status(), 400);
        // A body that fails to read is the client's fault, and a new file is removed.
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected EOF"))
            }
        }
        let bad = dir.join("bad");
        let e = w.write(&bad, &mut Broken).unwrap_err();
        assert_eq!(e.message, "invalid argument: reading upload: unexpected EOF");
        assert!(!bad.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn multipart_upload() {
        let dir = std::env::temp_dir().join(format!("envd-rs-files-mp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let j = job(&dir, None);
        let body = format!(
            "--X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{d}/one\"\r\n\r\n1\r\n\
             --X\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nskip\r\n\
             --X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel/two\"\r\n\r\n22\r\n--X--\r\n",
            d = dir.display()
        );
        let got = j.multipart("X", Box::new(io::Cursor::new(body.into_bytes()))).unwrap();
        let paths: Vec<&str> = got.iter().map(|e| e.path.as_str()).collect();
        let two = dir.join("rel/two");
        assert_eq!(paths, [dir.join("one").to_str().unwrap(), two.to_str().unwrap()]);
        assert_eq!(std::fs::read(&two).unwrap(), b"22");
        let e = j.multipart("", Box::new(io::empty())).unwrap_err();
        assert_eq!(e.message, "invalid argument: multipart Content-Type has no boundary");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entry_json() {
        let e = Entry {
            path: "/a/b".into(),
            name: "b".into(),
            kind: "file",
            metadata: None,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"path":"/a/b","name":"b","type":"file"}"#
        );
    }
}
