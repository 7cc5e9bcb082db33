//! The Connect service filesystem.Filesystem (envd/internal/filesystem):
//! Stat, MakeDir, Move, ListDir, Remove, the WatchDir stream and its
//! polled form for the synchronous Python SDK (CreateWatcher,
//! GetWatcherEvents, RemoveWatcher).
//!
//! File work runs on a thread of its own with the request user's rights
//! (`user::as_user`), so a user cannot read or change through envd what a
//! shell of theirs could not; the event loop never waits on the disk.

mod entry;
mod ops;
mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::http::request::Parts;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::connect::{self, pj};
use crate::error::{Code, Error};
use crate::http::{self, Request, Response};
use crate::state::State;
use crate::user::{self, User};

use entry::EntryInfo;
use watch::{FilesystemEvent, Tree, Watch};

/// DEFAULT_MAX_PENDING bounds the events a polled watcher keeps between
/// two GetWatcherEvents calls.
const DEFAULT_MAX_PENDING: usize = 100_000;

/// KEEPALIVE_HEADER is what E2B's SDKs send on WatchDir (seconds).
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";
const KEEPALIVE_DEFAULT: Duration = Duration::from_secs(90);

fn closed_error() -> Error {
    Error::new(Code::Canceled, "filesystem service closed: context canceled")
}

/// Service owns the watchers.
pub struct Service {
    /// true once close ran; every watch (streamed or polled) ends with it.
    closed: tokio::sync::watch::Sender<bool>,
    /// CreateWatcher's watchers by id.
    watchers: Mutex<HashMap<String, Arc<SyncWatcher>>>,
}

impl Default for Service {
    fn default() -> Service {
        Service {
            closed: tokio::sync::watch::channel(false).0,
            watchers: Mutex::new(HashMap::new()),
        }
    }
}

impl Service {
    /// close stops every watcher: polled watchers are removed and their
    /// tasks (which own the inotify instances) aborted; open WatchDir
    /// streams end cleanly as soon as their task sees the flag.
    pub fn close(&self) {
        self.closed.send_replace(true);
        let ws: Vec<_> = self.watchers.lock().unwrap().drain().map(|(_, w)| w).collect();
        for w in ws {
            if let Some(t) = w.task.lock().unwrap().take() {
                t.abort();
            }
        }
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

/// handle serves one RPC of the service.
pub async fn handle(st: Arc<State>, rpc: String, req: Request) -> Response {
    macro_rules! unary {
        ($f:ident) => {
            connect::serve_unary(req, |parts, m| async move { $f(&st, &parts, m).await }).await
        };
    }
    match rpc.as_str() {
        "Stat" => unary!(stat),
        "MakeDir" => unary!(make_dir),
        "Move" => unary!(move_entry),
        "ListDir" => unary!(list_dir),
        "Remove" => unary!(remove),
        "WatchDir" => watch_dir(st, req).await,
        "CreateWatcher" => unary!(create_watcher),
        "GetWatcherEvents" => unary!(get_watcher_events),
        "RemoveWatcher" => unary!(remove_watcher),
        _ => http::bytes(404, "text/plain; charset=utf-8", "404 page not found\n"),
    }
}

// ---- messages ---------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PathRequest {
    path: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ListDirRequest {
    path: String,
    #[serde(with = "pj::u32s")]
    depth: u32,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct MoveRequest {
    source: String,
    destination: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WatchRequest {
    path: String,
    recursive: bool,
    #[serde(alias = "include_entry")]
    include_entry: bool,
    #[serde(alias = "allow_network_mounts")]
    allow_network_mounts: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WatcherRequest {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

#[derive(Serialize)]
struct EntryResponse {
    entry: EntryInfo,
}

#[derive(Serialize)]
struct ListDirResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    entries: Vec<EntryInfo>,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CreateWatcherResponse {
    #[serde(skip_serializing_if = "String::is_empty")]
    watcher_id: String,
}

#[derive(Serialize)]
struct EventsResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    events: Vec<FilesystemEvent>,
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum WatchDirResponse<'a> {
    Start {},
    Filesystem(&'a FilesystemEvent),
    Keepalive {},
}

// ---- unary RPCs ---------------------------------------------------------------

/// resolve is the request user and the path as that user sees it.
fn resolve(st: &State, parts: &Parts, path: &str) -> Result<(PathBuf, Arc<User>), Error> {
    let u = st.rpc_user(parts)?;
    let p = user::resolve_path(path, &u, &st.defaults().workdir)?;
    Ok((p, u))
}

async fn stat(st: &Arc<State>, parts: &Parts, m: PathRequest) -> Result<EntryResponse, Error> {
    let (path, u) = resolve(st, parts, &m.path)?;
    let entry = user::as_user(u, move || entry::entry_info(&path)).await?;
    Ok(EntryResponse { entry })
}

async fn make_dir(st: &Arc<State>, parts: &Parts, m: PathRequest) -> Result<EntryResponse, Error> {
    let (path, u) = resolve(st, parts, &m.path)?;
    let (p, uu) = (path.clone(), u.clone());
    let entry = user::as_user(u.clone(), move || ops::make_dir(&p, &uu)).await?;
    crate::log!(st.log, Info, "directory created", "service" => "filesystem", "path" => path.display(), "user" => u.name);
    Ok(EntryResponse { entry })
}

async fn move_entry(st: &Arc<State>, parts: &Parts, m: MoveRequest) -> Result<EntryResponse, Error> {
    let (src, u) = resolve(st, parts, &m.source)?;
    let (dst, _) = resolve(st, parts, &m.destination)?;
    let (s, d, uu) = (src.clone(), dst.clone(), u.clone());
    let entry = user::as_user(u.clone(), move || ops::move_entry(&s, &d, &uu)).await?;
    crate::log!(st.log, Info, "moved", "service" => "filesystem", "path" => src.display(), "destination" => dst.display(), "user" => u.name);
    Ok(EntryResponse { entry })
}

async fn list_dir(st: &Arc<State>, parts: &Parts, m: ListDirRequest) -> Result<ListDirResponse, Error> {
    let (path, u) = resolve(st, parts, &m.path)?;
    let depth = (m.depth as usize).max(1);
    let st2 = st.clone();
    let entries = user::as_user(u, move || ops::list_dir(&path, depth, &st2.log)).await?;
    Ok(ListDirResponse { entries })
}

async fn remove(st: &Arc<State>, parts: &Parts, m: PathRequest) -> Result<Empty, Error> {
    let (path, u) = resolve(st, parts, &m.path)?;
    let p = path.clone();
    user::as_user(u.clone(), move || ops::remove_all(&p)).await?;
    crate::log!(st.log, Info, "removed", "service" => "filesystem", "path" => path.display(), "user" => u.name);
    Ok(Empty {})
}

// ---- watches --------------------------------------------------------------------

/// NETWORK_FS are the statfs(2) magic numbers of the filesystems E2B's
/// envd refuses to watch by default (inotify misses other hosts' changes).
const NETWORK_FS: [(i64, &str); 5] = [
    (0x6969, "nfs"),
    (0xFF534D42, "cifs"),
    (0x517B, "smb"),
    (0xFE534D42, "smb2"),
    (0x65735546, "fuse"),
];

/// watch_root resolves and checks the directory a WatchDir or
/// CreateWatcher request names: not_found when missing, invalid_argument
/// when not a directory or on a network filesystem (unless allowed).
async fn watch_root(st: &Arc<State>, parts: &Parts, path: &str, allow_network: bool) -> Result<PathBuf, Error> {
    let (root, u) = resolve(st, parts, path)?;
    let r = root.clone();
    // A user may watch only a directory they may read.
    let (is_dir, magic) = user::as_user(u, move || {
        let md = std::fs::metadata(&r).map_err(|e| Error::io(format!("stat {}", r.display()), e))?;
        if !md.is_dir() {
            return Ok((false, 0));
        }
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&r)
            .map_err(|e| Error::io(format!("open {}", r.display()), e))?;
        if allow_network {
            return Ok((true, 0));
        }
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(r.as_os_str()))
            .map_err(|_| Error::invalid("invalid path: NUL byte"))?;
        // SAFETY: c is NUL-terminated; sfs is a plain struct the call fills.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut sfs) } < 0 {
            return Err(Error::io(
                format!("statfs {}", r.display()),
                std::io::Error::last_os_error(),
            ));
        }
        Ok((true, sfs.f_type as i64))
    })
    .await?;
    if !is_dir {
        return Err(Error::invalid(format!(
            "invalid argument: {} is not a directory",
            root.display()
        )));
    }
    if !allow_network {
        if let Some((_, name)) = NETWORK_FS.iter().find(|(m, _)| *m == magic) {
            return Err(Error::invalid(format!(
                "invalid argument: {} is on a network filesystem ({name}); set allow_network_mounts to watch it anyway",
                root.display()
            )));
        }
    }
    Ok(root)
}

use std::os::unix::fs::OpenOptionsExt;

/// open_watch checks the request's directory and starts watching it.
async fn open_watch(st: &Arc<State>, parts: &Parts, m: &WatchRequest) -> Result<Watch, Error> {
    let root = watch_root(st, parts, &m.path, m.allow_network_mounts).await?;
    let (st2, recursive, entries) = (st.clone(), m.recursive, m.include_entry);
    let tree = user::blocking(move || Tree::open(st2, root, recursive, entries)).await?;
    Watch::new(tree)
}

/// keepalive_interval is the client's Keepalive-Ping-Interval (seconds).
fn keepalive_interval(parts: &Parts) -> Duration {
    match connect::header(parts, KEEPALIVE_HEADER).parse::<i64>() {
        Ok(n) if n > 0 => Duration::from_secs(n as u64),
        _ => KEEPALIVE_DEFAULT,
    }
}

/// watch_dir streams changes in a directory: a start event once the watch
/// is in place, then one event per change, with keepalives whenever the
/// stream has been idle for the keepalive interval. It ends when the
/// client goes, the deadline passes, the watch fails, or the service
/// closes (cleanly).
async fn watch_dir(st: Arc<State>, req: Request) -> Response {
    let (parts, m) = match connect::read_stream_request::<WatchRequest>(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let deadline = connect::timeout(&parts).map(|d| Instant::now() + d);
    if st.filesystem.is_closed() {
        return connect::stream_error(&closed_error());
    }
    let w = match open_watch(&st, &parts, &m).await {
        Ok(w) => w,
        Err(e) => return connect::stream_error(&e),
    };
    let idle = keepalive_interval(&parts);
    let mut s = connect::Stream::start(16);
    let resp = s.response();
    tokio::spawn(async move {
        if s.send(&WatchDirResponse::Start {}).await.is_err() {
            return;
        }
        let root = w.root().to_path_buf();
        let mut closed = st.filesystem.closed.subscribe();
        let mut next = Box::pin(w.next());
        let mut keepalive_at = Instant::now() + idle;
        let result = loop {
            tokio::select! {
                _ = s.closed() => return,
                _ = async { let _ = closed.wait_for(|c| *c).await; } => break None,
                _ = sleep_until(deadline) => break Some(Error::new(Code::DeadlineExceeded, "context deadline exceeded")),
                _ = tokio::time::sleep_until(keepalive_at) => {
                    if s.send(&WatchDirResponse::Keepalive {}).await.is_err() {
                        return;
                    }
                    keepalive_at = Instant::now() + idle;
                }
                (w, r) = &mut next => {
                    let (events, err) = match r {
                        Ok(evs) => (evs, None),
                        Err((evs, e)) => (evs, Some(e)),
                    };
                    for ev in &events {
                        if s.send(&WatchDirResponse::Filesystem(ev)).await.is_err() {
                            return;
                        }
                        keepalive_at = Instant::now() + idle;
                    }
                    if let Some(e) = err {
                        crate::log!(st.log, Warn, "watch failed", "service" => "filesystem", "path" => root.display(), "err" => e.message);
                        break Some(e);
                    }
                    match w {
                        Some(w) => next.set(w.next()),
                        None => break Some(Error::internal("watch ended")),
                    }
                }
            }
        };
        s.end(result.as_ref()).await;
    });
    resp
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// SyncWatcher is a watch created by CreateWatcher for the synchronous
/// Python SDK, which polls instead of holding a stream open.
struct SyncWatcher {
    events: Mutex<Vec<FilesystemEvent>>,
    /// Why the watch ended on its own; reported once events are drained.
    err: Mutex<Option<Error>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// watcher_id is 26 random base32 characters, lower case (Go's rand.Text).
fn watcher_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut b = [0u8; 26];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    b.iter().map(|x| ALPHABET[(x & 31) as usize] as char).collect()
}

async fn create_watcher(st: &Arc<State>, parts: &Parts, m: WatchRequest) -> Result<CreateWatcherResponse, Error> {
    if st.filesystem.is_closed() {
        return Err(closed_error());
    }
    let w = open_watch(st, parts, &m).await?;
    let root = w.root().to_path_buf();
    let sw = Arc::new(SyncWatcher {
        events: Mutex::new(Vec::new()),
        err: Mutex::new(None),
        task: Mutex::new(None),
    });
    let (st2, sw2, root2) = (st.clone(), sw.clone(), root.clone());
    let task = tokio::spawn(async move {
        let mut w = w;
        loop {
            let (back, r) = w.next().await;
            let (events, mut err) = match r {
                Ok(evs) => (evs, None),
                Err((evs, e)) => (evs, Some(e)),
            };
            {
                let mut q = sw2.events.lock().unwrap();
                for ev in events {
                    if q.len() >= DEFAULT_MAX_PENDING {
                        err = Some(Error::new(
                            Code::Internal,
                            format!(
                                "more than {DEFAULT_MAX_PENDING} events were not collected, later changes were lost: no buffer space available"
                            ),
                        ));
                        break;
                    }
                    q.push(ev);
                }
            }
            if let Some(e) = err {
                crate::log!(st2.log, Warn, "watcher failed", "service" => "filesystem", "path" => root2.display(), "err" => e.message);
                *sw2.err.lock().unwrap() = Some(e);
                return;
            }
            match back {
                Some(b) => w = b,
                None => return,
            }
        }
    });
    *sw.task.lock().unwrap() = Some(task);
    let id = watcher_id();
    {
        let mut ws = st.filesystem.watchers.lock().unwrap();
        if st.filesystem.is_closed() {
            if let Some(t) = sw.task.lock().unwrap().take() {
                t.abort();
            }
            return Err(closed_error());
        }
        ws.insert(id.clone(), sw);
    }
    crate::log!(st.log, Debug, "watcher created", "service" => "filesystem", "id" => id, "path" => root.display(), "recursive" => m.recursive);
    Ok(CreateWatcherResponse { watcher_id: id })
}

fn watcher_not_found(id: &str) -> Error {
    Error::not_found(format!("not found: watcher {id:?}"))
}

async fn get_watcher_events(st: &Arc<State>, _parts: &Parts, m: WatcherRequest) -> Result<EventsResponse, Error> {
    let w = st.filesystem.watchers.lock().unwrap().get(&m.watcher_id).cloned();
    let w = w.ok_or_else(|| watcher_not_found(&m.watcher_id))?;
    let events = std::mem::take(&mut *w.events.lock().unwrap());
    if events.is_empty() {
        if let Some(e) = w.err.lock().unwrap().clone() {
            return Err(e);
        }
    }
    Ok(EventsResponse { events })
}

async fn remove_watcher(st: &Arc<State>, _parts: &Parts, m: WatcherRequest) -> Result<Empty, Error> {
    let w = st.filesystem.watchers.lock().unwrap().remove(&m.watcher_id);
    let w = w.ok_or_else(|| watcher_not_found(&m.watcher_id))?;
    let task = w.task.lock().unwrap().take();
    if let Some(t) = task {
        // Its inotify instance is closed once the aborted task is dropped.
        t.abort();
        let _ = t.await;
    }
    Ok(Empty {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes() {
        let ev = FilesystemEvent {
            name: "a".into(),
            r#type: watch::EventType::Create,
            entry: None,
        };
        assert_eq!(
            serde_json::to_string(&WatchDirResponse::Start {}).unwrap(),
            r#"{"start":{}}"#
        );
        assert_eq!(
            serde_json::to_string(&WatchDirResponse::Keepalive {}).unwrap(),
            r#"{"keepalive":{}}"#
        );
        assert_eq!(
            serde_json::to_string(&WatchDirResponse::Filesystem(&ev)).unwrap(),
            r#"{"filesystem":{"name":"a","type":"EVENT_TYPE_CREATE"}}"#
        );
        assert_eq!(serde_json::to_string(&EventsResponse { events: vec![] }).unwrap(), "{}");
        let r: WatchRequest =
            connect::decode(br#"{"path":"/x","include_entry":true,"allowNetworkMounts":true}"#).unwrap();
        assert!(r.include_entry && r.allow_network_mounts && !r.recursive);
        let r: ListDirRequest = connect::decode(br#"{"path":"/x","depth":"3"}"#).unwrap();
        assert_eq!(r.depth, 3);
        let id = watcher_id();
        assert_eq!(id.len(), 26);
        assert!(id.bytes().all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(&c)));
    }
}
