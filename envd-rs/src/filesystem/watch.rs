//! Directory watches (watch.go): one inotify instance per watch, read
//! through tokio's AsyncFd, turned into events as Go's envd does with
//! fsnotify (whose Linux semantics are reproduced here), recursing into
//! subdirectories when asked.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use tokio::io::unix::AsyncFd;

use crate::error::{Code, Error};
use crate::state::State;
use crate::user;

use super::entry::{self, EntryInfo};

#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
pub enum EventType {
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct FilesystemEvent {
    pub name: String,
    pub r#type: EventType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

// fsnotify's operations, as bits.
const OP_CREATE: u32 = 1;
const OP_WRITE: u32 = 2;
const OP_REMOVE: u32 = 4;
const OP_RENAME: u32 = 8;
const OP_CHMOD: u32 = 16;

/// The mask fsnotify's Add asks for (Create|Write|Remove|Rename|Chmod).
const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_MOVE_SELF
    | libc::IN_ATTRIB;

/// op_of is fsnotify's newEvent: the operations of an inotify mask.
fn op_of(mask: u32) -> u32 {
    let mut op = 0;
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        op |= OP_CREATE;
    }
    if mask & (libc::IN_DELETE_SELF | libc::IN_DELETE) != 0 {
        op |= OP_REMOVE;
    }
    if mask & libc::IN_MODIFY != 0 {
        op |= OP_WRITE;
    }
    if mask & (libc::IN_MOVE_SELF | libc::IN_MOVED_FROM) != 0 {
        op |= OP_RENAME;
    }
    if mask & libc::IN_ATTRIB != 0 {
        op |= OP_CHMOD;
    }
    op
}

/// event_types splits an operation into one event type per bit, in E2B's
/// order.
fn event_types(op: u32) -> Vec<EventType> {
    [
        (OP_CREATE, EventType::Create),
        (OP_RENAME, EventType::Rename),
        (OP_CHMOD, EventType::Chmod),
        (OP_WRITE, EventType::Write),
        (OP_REMOVE, EventType::Remove),
    ]
    .into_iter()
    .filter(|(bit, _)| op & bit != 0)
    .map(|(_, t)| t)
    .collect()
}

/// Raw is one inotify event as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Raw {
    wd: i32,
    mask: u32,
    name: Vec<u8>,
}

/// parse splits a buffer read from inotify into its events.
fn parse(buf: &[u8]) -> Vec<Raw> {
    const HDR: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    let mut off = 0;
    while off + HDR <= buf.len() {
        let i32_at = |o: usize| i32::from_ne_bytes(buf[o..o + 4].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap());
        let wd = i32_at(off);
        let mask = u32_at(off + 4);
        let len = u32_at(off + 12) as usize;
        let end = (off + HDR + len).min(buf.len());
        let mut name = buf[off + HDR..end].to_vec();
        while name.last() == Some(&0) {
            name.pop();
        }
        out.push(Raw { wd, mask, name });
        off += HDR + len;
    }
    out
}

struct WatchedDir {
    ino: u64,
    kids: HashSet<PathBuf>,
}

/// Tree is one inotify watch of a directory and, when recursive, of every
/// directory below it, including ones created or moved in later. Its
/// methods do blocking file work: run them off the event loop.
pub struct Tree {
    fd: Arc<OwnedFd>,
    pub root: PathBuf,
    recursive: bool,
    entries: bool,
    st: Arc<State>,
    // fsnotify's own bookkeeping: which path each watch descriptor is.
    by_wd: HashMap<i32, PathBuf>,
    by_path: HashMap<PathBuf, i32>,
    /// The watched directories of a recursive tree, root included.
    dirs: HashMap<PathBuf, WatchedDir>,
    /// A subdirectory just forgotten because it moved out of the tree,
    /// whose own IN_MOVE_SELF must not become a second RENAME.
    moved_dir: Option<PathBuf>,
}

fn prefixed(prefix: &str, e: Error) -> Error {
    Error {
        message: format!("{prefix}: {}", e.message),
        ..e
    }
}

/// errstr renders an io::Error as Go does.
fn errstr(e: io::Error) -> String {
    Error::io("", e).message.trim_start_matches(": ").to_string()
}

/// skippable errors leave one directory of a recursive watch unwatched
/// without failing the watch.
fn skippable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::EPERM)
    )
}

impl Tree {
    /// open starts watching root (an existing directory).
    pub fn open(st: Arc<State>, root: PathBuf, recursive: bool, entries: bool) -> Result<Tree, Error> {
        let what = format!("watch {}", root.display());
        // SAFETY: inotify_init1 takes flags only.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(Error::io(
                format!("{what}: couldn't initialize inotify"),
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: fd is a new descriptor that nothing else owns.
        let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut t = Tree {
            fd,
            root: root.clone(),
            recursive,
            entries,
            st,
            by_wd: HashMap::new(),
            by_path: HashMap::new(),
            dirs: HashMap::new(),
            moved_dir: None,
        };
        t.add(&root).map_err(|e| Error::io(&what, e))?;
        if recursive {
            t.dirs.insert(
                root.clone(),
                WatchedDir {
                    ino: 0,
                    kids: HashSet::new(),
                },
            );
            t.add_subdirs(&root, None).map_err(|e| prefixed(&what, e))?;
        }
        Ok(t)
    }

    /// needs_io says whether handling events does file work (else it is
    /// cheap enough for the event loop).
    fn needs_io(&self) -> bool {
        self.recursive || self.entries
    }

    /// add is fsnotify's Add.
    fn add(&mut self, path: &Path) -> io::Result<()> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let old = self.by_path.get(path).copied();
        let mask = if old.is_some() {
            WATCH_MASK | libc::IN_MASK_ADD
        } else {
            WATCH_MASK
        };
        // SAFETY: c is NUL-terminated; the fd is ours.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        if self.by_wd.contains_key(&wd) {
            return Ok(()); // the same inode, already watched (under its first path)
        }
        if let Some(o) = old {
            self.by_wd.remove(&o);
        }
        self.by_wd.insert(wd, path.to_path_buf());
        self.by_path.insert(path.to_path_buf(), wd);
        Ok(())
    }

    /// remove is fsnotify's Remove; Ok(false) for a path not watched.
    fn remove(&mut self, path: &Path) -> io::Result<bool> {
        let Some(wd) = self.by_path.remove(path) else {
            return Ok(false);
        };
        self.by_wd.remove(&wd);
        // SAFETY: the fd is ours; a stale wd only fails with EINVAL.
        if unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(true)
    }

    fn drop_wd(&mut self, wd: i32) {
        if let Some(p) = self.by_wd.remove(&wd) {
            if self.by_path.get(&p) == Some(&wd) {
                self.by_path.remove(&p);
            }
        }
    }

    /// process turns a batch of inotify events into FilesystemEvents
    /// (appended to out); an error ends the watch after the events before it.
    pub fn process(&mut self, raws: Vec<Raw>, out: &mut Vec<FilesystemEvent>) -> Result<(), Error> {
        for raw in raws {
            if raw.mask & libc::IN_Q_OVERFLOW != 0 {
                return Err(Error::internal(format!(
                    "watch {}: fsnotify: queue or buffer overflow",
                    self.root.display()
                )));
            }
            if let Some((path, op)) = self.fsnotify_event(&raw)? {
                self.handle(user::clean(&path), op, out)?;
            }
        }
        Ok(())
    }

    /// fsnotify_event is fsnotify's handleEvent for watches added with Add.
    fn fsnotify_event(&mut self, raw: &Raw) -> Result<Option<(PathBuf, u32)>, Error> {
        let Some(wpath) = self.by_wd.get(&raw.wd).cloned() else {
            return Ok(None);
        };
        let name = if raw.name.is_empty() {
            wpath.clone()
        } else {
            wpath.join(OsStr::from_bytes(&raw.name))
        };
        if raw.mask & (libc::IN_IGNORED | libc::IN_UNMOUNT) != 0 {
            self.drop_wd(raw.wd);
            return Ok(None);
        }
        if raw.mask & libc::IN_DELETE_SELF != 0 {
            self.drop_wd(raw.wd);
        }
        if raw.mask & libc::IN_MOVE_SELF != 0 {
            if let Err(e) = self.remove(&wpath) {
                return Err(Error::io(format!("watch {}", self.root.display()), e));
            }
        }
        if raw.mask & libc::IN_DELETE_SELF != 0 {
            if let Some(parent) = wpath.parent() {
                if self.by_path.contains_key(parent) {
                    return Ok(None); // the parent's watch reports it
                }
            }
        }
        Ok(Some((name, op_of(raw.mask))))
    }

    /// handle reports one event and, for a recursive tree, keeps the set
    /// of watched subdirectories in step with it.
    fn handle(&mut self, path: PathBuf, op: u32, out: &mut Vec<FilesystemEvent>) -> Result<(), Error> {
        if self.recursive && self.moved_dir.as_deref() == Some(path.as_path()) && op == OP_RENAME {
            self.moved_dir = None;
            return Ok(());
        }
        self.moved_dir = None;
        let mut found = Vec::new();
        if self.recursive {
            if op & (OP_REMOVE | OP_RENAME) != 0 {
                if self.forget(&path) && op & OP_RENAME != 0 {
                    self.moved_dir = Some(path.clone());
                }
            } else if op & OP_CREATE != 0 {
                // Watch a new directory and everything below it before
                // reporting it, so that writes inside it are seen.
                let what = format!("watch {}", path.display());
                let added = self.watch_dir(&path).map_err(|e| Error::io(&what, e))?;
                if added {
                    self.add_subdirs(&path, Some(&mut found))
                        .map_err(|e| prefixed(&what, e))?;
                }
            }
        }
        for typ in event_types(op) {
            out.push(self.event(&path, typ));
        }
        // Entries created before the new directory's watch was in place.
        for p in found {
            out.push(self.event(&p, EventType::Create));
        }
        Ok(())
    }

    /// watch_dir adds a watch for path if it is a directory not watched
    /// yet; true when it did, so the caller scans its contents.
    fn watch_dir(&mut self, path: &Path) -> io::Result<bool> {
        let md = match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => m,
            _ => return Ok(false),
        };
        if self.dirs.get(path).is_some_and(|d| d.ino == md.ino()) {
            return Ok(false);
        }
        self.forget(path);
        if let Err(e) = self.add(path) {
            if skippable(&e) {
                crate::log!(self.st.log, Debug, "watch: skipping directory", "service" => "filesystem", "path" => path.display(), "err" => errstr(e));
                return Ok(false);
            }
            return Err(e);
        }
        self.dirs.insert(
            path.to_path_buf(),
            WatchedDir {
                ino: md.ino(),
                kids: HashSet::new(),
            },
        );
        if let Some(parent) = path.parent().and_then(|p| self.dirs.get_mut(p)) {
            parent.kids.insert(path.to_path_buf());
        }
        Ok(true)
    }

    /// add_subdirs watches every directory below dir (not following
    /// symlinks); with found, every entry below dir is appended, parents
    /// first.
    fn add_subdirs(&mut self, dir: &Path, mut found: Option<&mut Vec<PathBuf>>) -> Result<(), Error> {
        let des = match super::ops::read_dir_sorted(dir) {
            Ok(d) => d,
            Err(e) if skippable(&e) => {
                crate::log!(self.st.log, Debug, "watch: skipping directory", "service" => "filesystem", "path" => dir.display(), "err" => errstr(e));
                return Ok(());
            }
            Err(e) => return Err(Error::io(format!("open {}", dir.display()), e)),
        };
        for (name, is_dir) in des {
            let p = dir.join(name);
            if let Some(f) = found.as_deref_mut() {
                f.push(p.clone());
            }
            if !is_dir {
                continue;
            }
            if self
                .watch_dir(&p)
                .map_err(|e| Error::io(format!("watch {}", p.display()), e))?
            {
                self.add_subdirs(&p, found.as_deref_mut())?;
            }
        }
        Ok(())
    }

    /// forget drops the watches of path and everything below it; true when
    /// path was a watched subdirectory.
    fn forget(&mut self, path: &Path) -> bool {
        let kids = match self.dirs.get_mut(path) {
            Some(d) => std::mem::take(&mut d.kids),
            None => return false,
        };
        for k in kids {
            self.forget(&k);
        }
        self.dirs.remove(path);
        if path == self.root {
            return false;
        }
        if let Some(parent) = path.parent().and_then(|p| self.dirs.get_mut(p)) {
            parent.kids.remove(path);
        }
        let _ = self.remove(path);
        true
    }

    /// event builds the event for path, named relative to the root; only
    /// events about an entry that should still exist carry its EntryInfo.
    fn event(&self, path: &Path, typ: EventType) -> FilesystemEvent {
        let name = match path.strip_prefix(&self.root) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => entry::valid_utf8(r.as_os_str().as_bytes()),
            Err(_) => entry::valid_utf8(path.as_os_str().as_bytes()),
        };
        let mut ev = FilesystemEvent {
            name,
            r#type: typ,
            entry: None,
        };
        if self.entries && typ != EventType::Remove && typ != EventType::Rename {
            match entry::entry_info(path) {
                Ok(e) => ev.entry = Some(e),
                Err(e) if e.code == Code::NotFound => {} // gone already: a benign race
                Err(e) => {
                    crate::log!(self.st.log, Warn, "watch: cannot describe entry", "service" => "filesystem", "path" => path.display(), "err" => e.message)
                }
            }
        }
        ev
    }
}

/// Watch is a Tree being read on the event loop.
pub struct Watch {
    tree: Tree,
    afd: AsyncFd<Arc<OwnedFd>>,
    buf: Vec<u8>,
}

/// Failed is how a watch ended on its own: the events before the error,
/// and the error.
pub type Failed = (Vec<FilesystemEvent>, Error);

impl Watch {
    pub fn new(tree: Tree) -> Result<Watch, Error> {
        // SAFETY: the Arc keeps the descriptor open, and the same one, for
        // as long as the AsyncFd holds it.
        let afd = unsafe { AsyncFd::register_with_interest(tree.fd.clone(), tokio::io::Interest::READABLE) }
            .map_err(|e| Error::io(format!("watch {}", tree.root.display()), e.into()))?;
        Ok(Watch {
            tree,
            afd,
            buf: vec![0u8; 64 << 10],
        })
    }

    pub fn root(&self) -> &Path {
        &self.tree.root
    }

    /// next waits for the next batch of events. It takes and gives back
    /// the watch so that the caller can keep one pending call across a
    /// select loop (cancelling it mid-batch would lose events).
    pub async fn next(mut self) -> (Option<Watch>, Result<Vec<FilesystemEvent>, Failed>) {
        let raws = loop {
            let mut guard = match self.afd.readable().await {
                Ok(g) => g,
                Err(e) => {
                    let err = Error::io(format!("watch {}", self.tree.root.display()), e);
                    return (Some(self), Err((Vec::new(), err)));
                }
            };
            let buf = &mut self.buf;
            match guard.try_io(|fd| {
                // SAFETY: buf has buf.len() writable bytes.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Ok(n)) => break parse(&self.buf[..n]),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => {
                    let err = Error::io(format!("watch {}", self.tree.root.display()), e);
                    return (Some(self), Err((Vec::new(), err)));
                }
                Err(_would_block) => continue,
            }
        };
        if !self.tree.needs_io() {
            let mut out = Vec::new();
            let r = self.tree.process(raws, &mut out);
            return (Some(self), r.map(|()| out).map_err(|e| (Vec::new(), e)));
        }
        let Watch { tree, afd, buf } = self;
        let r = user::blocking(move || {
            let mut tree = tree;
            let mut out = Vec::new();
            let r = tree.process(raws, &mut out);
            Ok((tree, out, r))
        })
        .await;
        match r {
            Ok((tree, out, Ok(()))) => (Some(Watch { tree, afd, buf }), Ok(out)),
            Ok((tree, out, Err(e))) => (Some(Watch { tree, afd, buf }), Err((out, e))),
            Err(e) => (None, Err((Vec::new(), e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_types() {
        assert_eq!(op_of(libc::IN_CREATE), OP_CREATE);
        assert_eq!(op_of(libc::IN_MOVED_TO | libc::IN_ISDIR), OP_CREATE);
        assert_eq!(op_of(libc::IN_MOVE_SELF), OP_RENAME);
        assert_eq!(op_of(libc::IN_DELETE_SELF), OP_REMOVE);
        assert_eq!(
            event_types(OP_CREATE | OP_WRITE | OP_REMOVE | OP_RENAME | OP_CHMOD),
            vec![
                EventType::Create,
                EventType::Rename,
                EventType::Chmod,
                EventType::Write,
                EventType::Remove
            ]
        );
    }

    fn state() -> Arc<State> {
        crate::state::for_test()
    }

    async fn collect(w: Watch, want: &str) -> (Watch, Vec<(String, EventType)>) {
        let mut w = w;
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !got.iter().any(|(n, _): &(String, EventType)| n == want) {
            let (back, r) = tokio::time::timeout_at(deadline, w.next())
                .await
                .expect("no events in time");
            for ev in r.expect("watch failed") {
                got.push((ev.name, ev.r#type));
            }
            w = back.unwrap();
        }
        (w, got)
    }

    #[tokio::test]
    async fn recursive_tree() {
        let d = std::env::temp_dir().join(format!("envd-rs-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("old/inner")).unwrap();
        let w = Watch::new(Tree::open(state(), d.clone(), true, false).unwrap()).unwrap();
        // A file in a directory that existed before the watch.
        std::fs::write(d.join("old/inner/f"), "x").unwrap();
        let (w, got) = collect(w, "old/inner/f").await;
        assert_eq!(got[0], ("old/inner/f".to_string(), EventType::Create));
        // mkdir -p and a file right after: all reported as created.
        std::fs::create_dir_all(d.join("new/a/b")).unwrap();
        std::fs::write(d.join("new/a/b/g"), "x").unwrap();
        let (w, got) = collect(w, "new/a/b/g").await;
        assert!(got.contains(&("new".to_string(), EventType::Create)), "{got:?}");
        // A directory moved out of the tree is forgotten: one RENAME.
        std::fs::rename(
            d.join("new"),
            std::env::temp_dir().join(format!("envd-rs-watch-out-{}", std::process::id())),
        )
        .unwrap();
        std::fs::write(d.join("marker"), "x").unwrap();
        let (_w, got) = collect(w, "marker").await;
        assert_eq!(
            got.iter()
                .filter(|(n, t)| n == "new" && *t == EventType::Rename)
                .count(),
            1,
            "{got:?}"
        );
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("envd-rs-watch-out-{}", std::process::id())));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn parse_events() {
        let mut b = Vec::new();
        for (wd, mask, name) in [(1i32, libc::IN_CREATE, &b"abc"[..]), (2, libc::IN_DELETE_SELF, b"")] {
            let len = if name.is_empty() { 0 } else { 16 };
            b.extend_from_slice(&wd.to_ne_bytes());
            b.extend_from_slice(&mask.to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            b.extend_from_slice(&(len as u32).to_ne_bytes());
            let mut n = name.to_vec();
            n.resize(len, 0);
            b.extend_from_slice(&n);
        }
        assert_eq!(
            parse(&b),
            vec![
                Raw {
                    wd: 1,
                    mask: libc::IN_CREATE,
                    name: b"abc".to_vec()
                },
                Raw {
                    wd: 2,
                    mask: libc::IN_DELETE_SELF,
                    name: vec![]
                }
            ]
        );
    }
}
