//! The Connect service process.Process (envd/internal/process): it starts
//! commands as sandbox users, streams their output to any number of
//! readers and takes their input, signals and terminal resizes.
//!
//! Commands outlive the requests that started them: each is owned by a task
//! of its own (`run`), which forwards its output into a fan-out, waits for
//! its exit status (the reaper's), enforces its lifetime and publishes its
//! end; streams only read from the fan-out.

mod cgroup;
mod fanout;
mod spawn;
mod sweep;
mod wire;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::http::request::Parts;
use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, OnceCell};
use tokio::time::Instant;

use crate::connect::{self, Stream};
use crate::error::{Code, Error};
use crate::http::{self, Request, Response};
use crate::reaper::ExitInfo;
use crate::state::State;

use cgroup::{Cgroup, Tree};
use fanout::{Fanout, Subscription};
use sweep::{Leftover, Sessions};
use wire::*;

/// How long an exited process stays connectable.
const RETENTION: Duration = Duration::from_secs(30);
/// Caps one data event.
const CHUNK_SIZE: usize = 32 << 10;
/// How many data events a reader may lag behind.
const SUBSCRIBER_BUFFER: usize = 1024;
/// How long output is still read once a process told to stop has ended.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// Messages a stream's body holds before its sender waits for the client.
const STREAM_BUFFER: usize = 16;
/// The keepalive header and its default (envd/internal/keepalive).
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";
const KEEPALIVE_DEFAULT: Duration = Duration::from_secs(90);

pub(crate) fn invalid(msg: impl std::fmt::Display) -> Error {
    Error::invalid(format!("invalid argument: {msg}"))
}

pub(crate) fn not_found(msg: impl std::fmt::Display) -> Error {
    Error::not_found(format!("not found: {msg}"))
}

pub(crate) fn precondition(msg: impl std::fmt::Display) -> Error {
    Error::new(Code::FailedPrecondition, format!("failed precondition: {msg}"))
}

fn deadline_exceeded(prefix: &str) -> Error {
    Error::new(Code::DeadlineExceeded, format!("{prefix}context deadline exceeded"))
}

/// An event a process publishes to its readers.
#[derive(Clone)]
pub(crate) enum Event {
    Data(Kind, Bytes),
    End(EndInfo),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Stdout,
    Stderr,
    Pty,
}

/// EndInfo is a process's end event.
#[derive(Clone, Debug, Default)]
pub(crate) struct EndInfo {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    pub error: Option<String>,
}

type Fd = Arc<AsyncFd<OwnedFd>>;

/// Proc is one command envd started, from its spawn until it is forgotten
/// after the retention window.
struct Proc {
    pid: u32,
    tag: Option<String>,
    info: ConfigOut,
    tty: Mutex<Option<Fd>>,
    stdin: Mutex<Option<Fd>>,
    write_lock: tokio::sync::Mutex<()>,
    events: Fanout<Event>,
    stopping: watch::Sender<bool>,
    done: watch::Sender<bool>,
    end: Mutex<Option<EndInfo>>,
    cg: Option<Arc<Cgroup>>,
}

impl Proc {
    fn finished(&self) -> bool {
        *self.done.borrow()
    }

    fn err_exited(&self) -> Error {
        not_found(format!("process with pid {} has exited", self.pid))
    }

    fn tty(&self) -> Option<Fd> {
        self.tty.lock().unwrap().clone()
    }

    /// signal delivers sig to the process group; SIGKILL and SIGTERM also
    /// mark the process as stopping.
    fn signal(&self, sig: i32) -> Result<(), Error> {
        if sig == libc::SIGKILL || sig == libc::SIGTERM {
            self.stopping.send_replace(true);
        }
        // SAFETY: plain kill(2) of the process group setsid made.
        if unsafe { libc::kill(-(self.pid as i32), sig) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Err(self.err_exited());
            }
            return Err(Error::io(format!("signal process {}", self.pid), e));
        }
        Ok(())
    }

    fn close_stdin(&self) {
        self.stdin.lock().unwrap().take();
    }

    /// input is where input of the given kind goes.
    fn input(&self, is_pty: bool) -> Result<Fd, Error> {
        let tty = self.tty();
        match (is_pty, tty) {
            (true, None) => Err(precondition(format!(
                "process {} has no PTY; send stdin instead",
                self.pid
            ))),
            (true, Some(t)) => Ok(t),
            (false, Some(_)) => Err(precondition(format!(
                "process {} has a PTY; send pty input instead",
                self.pid
            ))),
            (false, None) => self.stdin.lock().unwrap().clone().ok_or_else(|| {
                precondition(format!(
                    "stdin of process {} is not open (started with stdin=false, or closed)",
                    self.pid
                ))
            }),
        }
    }

    /// write sends data to f, giving up at the request's deadline.
    async fn write(&self, f: Fd, data: &[u8], deadline: Option<Instant>) -> Result<(), Error> {
        let _g = self.write_lock.lock().await;
        let all = async {
            let mut off = 0;
            while off < data.len() {
                let mut guard = f.writable().await?;
                match guard.try_io(|fd| spawn::write_fd(fd, &data[off..])) {
                    Ok(Ok(n)) => off += n,
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {}
                }
            }
            Ok(())
        };
        let r = match deadline {
            Some(d) => match tokio::time::timeout_at(d, all).await {
                Ok(r) => r,
                Err(_) => return Err(deadline_exceeded(&format!("write input of process {}: ", self.pid))),
            },
            None => all.await,
        };
        match r {
            Ok(()) => Ok(()),
            Err(_) if self.finished() => Err(self.err_exited()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::EIO | libc::EBADF)) => {
                Err(precondition(format!("input of process {} is closed", self.pid)))
            }
            Err(e) => Err(Error::io(format!("write input of process {}", self.pid), e)),
        }
    }

    /// end_info waits for the end event (immediate once the fan-out ended).
    async fn end_info(&self) -> EndInfo {
        let mut done = self.done.subscribe();
        let _ = done.wait_for(|d| *d).await;
        self.end.lock().unwrap().clone().unwrap_or_default()
    }
}

struct Inner {
    closed: bool,
    procs: HashMap<u32, Arc<Proc>>,
    /// The latest process per tag; None while its start is pending.
    tags: HashMap<String, Option<Arc<Proc>>>,
}

/// Service owns every process envd started.
pub struct Service {
    inner: Mutex<Inner>,
    closing: watch::Sender<bool>,
    cgroups: OnceCell<Option<Arc<Tree>>>,
    no_cgroups: AtomicBool,
    leftovers: Arc<Sessions>,
}

impl Default for Service {
    fn default() -> Service {
        Service {
            inner: Mutex::new(Inner {
                closed: false,
                procs: HashMap::new(),
                tags: HashMap::new(),
            }),
            closing: watch::channel(false).0,
            cgroups: OnceCell::new(),
            no_cgroups: AtomicBool::new(false),
            leftovers: Arc::new(Sessions::default()),
        }
    }
}

impl Service {
    /// close kills every command (envd's shutdown) and makes further
    /// starts fail.
    pub fn close(&self) {
        let procs: Vec<Arc<Proc>> = {
            let mut g = self.inner.lock().unwrap();
            g.closed = true;
            g.procs.values().filter(|p| !p.finished()).cloned().collect()
        };
        self.closing.send_replace(true);
        for p in procs {
            let _ = p.signal(libc::SIGKILL);
            Leftover {
                sid: p.pid as i32,
                cg: p.cg.clone(),
            }
            .end();
        }
    }

    /// admit reserves a tag before anything is spawned.
    fn admit(&self, tag: &Option<String>) -> Result<(), Error> {
        let mut g = self.inner.lock().unwrap();
        if g.closed {
            return Err(Error::new(Code::Canceled, "envd is shutting down: context canceled"));
        }
        if let Some(t) = tag {
            match g.tags.get(t) {
                Some(None) => return Err(tag_taken(t)),
                Some(Some(old)) if !old.finished() => return Err(tag_taken(t)),
                _ => {}
            }
            g.tags.insert(t.clone(), None);
        }
        Ok(())
    }

    fn abandon(&self, tag: &Option<String>) {
        if let Some(t) = tag {
            let mut g = self.inner.lock().unwrap();
            if matches!(g.tags.get(t), Some(None)) {
                g.tags.remove(t);
            }
        }
    }

    fn register(&self, p: &Arc<Proc>) {
        let mut g = self.inner.lock().unwrap();
        if let Some(old) = g.procs.get(&p.pid).cloned() {
            forget_locked(&mut g, &old);
        }
        g.procs.insert(p.pid, p.clone());
        if let Some(t) = &p.tag {
            g.tags.insert(t.clone(), Some(p.clone()));
        }
    }

    /// retire keeps p connectable for the retention window, then forgets it.
    fn retire(&self, st: &Arc<State>, p: &Arc<Proc>) {
        if self.inner.lock().unwrap().closed {
            return;
        }
        let st = st.clone();
        let p = p.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETENTION).await;
            let mut g = st.process.inner.lock().unwrap();
            forget_locked(&mut g, &p);
        });
    }

    fn lookup(&self, sel: &Option<Selector>) -> Result<Arc<Proc>, Error> {
        let g = self.inner.lock().unwrap();
        let sel = sel.clone().unwrap_or_default();
        if let Some(pid) = sel.pid {
            return g
                .procs
                .get(&pid)
                .cloned()
                .ok_or_else(|| not_found(format!("process with pid {pid}")));
        }
        if let Some(tag) = sel.tag {
            if let Some(Some(p)) = g.tags.get(&tag) {
                if g.procs.get(&p.pid).is_some_and(|q| Arc::ptr_eq(p, q)) {
                    return Ok(p.clone());
                }
            }
            return Err(not_found(format!("process with tag {tag:?}")));
        }
        Err(invalid("process selector needs a pid or a tag"))
    }

    fn lookup_running(&self, sel: &Option<Selector>) -> Result<Arc<Proc>, Error> {
        let p = self.lookup(sel)?;
        if p.finished() {
            return Err(p.err_exited());
        }
        Ok(p)
    }

    fn running(&self) -> Vec<Arc<Proc>> {
        let g = self.inner.lock().unwrap();
        let mut out: Vec<Arc<Proc>> = g.procs.values().filter(|p| !p.finished()).cloned().collect();
        out.sort_by_key(|p| p.pid);
        out
    }

    /// tree is the cgroup tree, organised on its first call.
    async fn tree(&self, st: &Arc<State>) -> Option<Arc<Tree>> {
        let root = st.cfg.cgroup_root.clone()?;
        self.cgroups
            .get_or_init(|| async {
                match Tree::open(&root, st.cfg.pids_reserve) {
                    Ok(t) => {
                        log!(st.log, Info, "commands get cgroups of their own", "service" => "process", "root" => root,
                            "pids_reserve" => st.cfg.pids_reserve);
                        Some(Arc::new(t))
                    }
                    Err(reason) => {
                        log!(st.log, Info, "commands share envd's cgroup", "service" => "process", "reason" => reason);
                        None
                    }
                }
            })
            .await
            .clone()
    }

    /// new_cgroup is a cgroup for a command about to start, None without a
    /// tree or when none can be made.
    async fn new_cgroup(&self, st: &Arc<State>) -> Option<Arc<Cgroup>> {
        if self.no_cgroups.load(Ordering::SeqCst) {
            return None;
        }
        let t = self.tree(st).await?;
        match t.new_cgroup() {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                log!(st.log, Warn, "a command without a cgroup of its own", "service" => "process", "err" => e);
                None
            }
        }
    }
}

fn tag_taken(t: &str) -> Error {
    Error::new(
        Code::AlreadyExists,
        format!("already exists: a running process already has tag {t:?}"),
    )
}

fn forget_locked(g: &mut Inner, p: &Arc<Proc>) {
    if g.procs.get(&p.pid).is_some_and(|q| Arc::ptr_eq(p, q)) {
        g.procs.remove(&p.pid);
    }
    if let Some(t) = &p.tag {
        if matches!(g.tags.get(t), Some(Some(q)) if Arc::ptr_eq(p, q)) {
            g.tags.remove(t);
        }
    }
}

/// warm organises the commands' cgroups after the first answer.
pub async fn warm(st: &Arc<State>) {
    st.process.tree(st).await;
}

/// handle serves one RPC of the service.
pub async fn handle(st: Arc<State>, rpc: String, req: Request) -> Response {
    match rpc.as_str() {
        "Start" => start_rpc(st, req).await,
        "Connect" => connect_rpc(st, req).await,
        "List" => list_rpc(st, req).await,
        "SendInput" => send_input_rpc(st, req).await,
        "StreamInput" => stream_input_rpc(st, req).await,
        "SendSignal" => send_signal_rpc(st, req).await,
        "Update" => update_rpc(st, req).await,
        "CloseStdin" => close_stdin_rpc(st, req).await,
        _ => http::status(404),
    }
}

fn keepalive_interval(parts: &Parts) -> Duration {
    match connect::header(parts, KEEPALIVE_HEADER).parse::<i64>() {
        Ok(n) if n > 0 => Duration::from_secs(n as u64),
        _ => KEEPALIVE_DEFAULT,
    }
}

/// lifetime reads the process's lifetime from Connect-Timeout-Ms (0 =
/// unlimited).
fn lifetime(v: &str) -> Result<Duration, Error> {
    if v.is_empty() {
        return Ok(Duration::ZERO);
    }
    match v.parse::<i64>() {
        Ok(ms) if (0..=i64::MAX / 1_000_000).contains(&ms) => Ok(Duration::from_millis(ms as u64)),
        _ => Err(invalid(format!("Connect-Timeout-Ms {v:?}"))),
    }
}

async fn start_rpc(st: Arc<State>, req: Request) -> Response {
    let arrived = Instant::now();
    let (parts, msg) = match connect::read_stream_request::<StartRequest>(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let deadline = connect::timeout(&parts).map(|d| arrived + d);
    match start(&st, msg, &parts).await {
        Err(e) => connect::stream_error(&e),
        Ok((p, sub)) => {
            let mut s = Stream::start(STREAM_BUFFER);
            let resp = s.response();
            let interval = keepalive_interval(&parts);
            tokio::spawn(stream_events(st, p, Some(sub), s, interval, deadline));
            resp
        }
    }
}

async fn connect_rpc(st: Arc<State>, req: Request) -> Response {
    let arrived = Instant::now();
    let (parts, msg) = match connect::read_stream_request::<ConnectRequest>(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let deadline = connect::timeout(&parts).map(|d| arrived + d);
    let p = match st.process.lookup(&msg.process) {
        Ok(p) => p,
        Err(e) => return connect::stream_error(&e),
    };
    let sub = p.events.subscribe();
    let mut s = Stream::start(STREAM_BUFFER);
    let resp = s.response();
    tokio::spawn(stream_events(st, p, sub, s, keepalive_interval(&parts), deadline));
    resp
}

/// start spawns the process of msg and returns it with a blocking
/// subscription that has seen nothing yet.
async fn start(st: &Arc<State>, msg: StartRequest, parts: &Parts) -> Result<(Arc<Proc>, Subscription<Event>), Error> {
    let svc = &st.process;
    let spec = spawn::spec(st, &msg, parts)?;
    let timeout = lifetime(connect::header(parts, "connect-timeout-ms"))?;
    svc.admit(&spec.tag)?;
    let events = Fanout::new(SUBSCRIBER_BUFFER);
    let sub = events.subscribe_blocking().expect("a new fan-out takes subscribers");
    svc.leftovers.check();
    let mut cg = svc.new_cgroup(st).await;
    let mut r = spawn::spawn(st, &spec, cg.as_deref());
    if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EAGAIN)) && svc.leftovers.sweep() > 0 {
        // Out of pids: what ended commands left running goes.
        r = spawn::spawn(st, &spec, cg.as_deref());
    }
    if let (Err(e), Some(c)) = (&r, &cg) {
        if e.raw_os_error() != Some(libc::EAGAIN) {
            // Once more without the cgroup: if that works, the kernel
            // refused the move into it, and commands run without cgroups.
            let c = c.clone();
            cg = None;
            r = spawn::spawn(st, &spec, None);
            if r.is_ok() {
                log!(st.log, Warn, "commands get no cgroup of their own: the kernel refused the clone into one",
                    "service" => "process");
                svc.no_cgroups.store(true, Ordering::SeqCst);
            }
            c.discard();
        }
    }
    let sp = match r {
        Ok(sp) => sp,
        Err(e) => {
            if let Some(c) = &cg {
                c.discard();
            }
            svc.abandon(&spec.tag);
            return Err(Error::io(format!("start {:?}: fork/exec {}", spec.cmd, spec.path), e));
        }
    };
    let pid = sp.pid as u32;
    let tty = match sp.tty {
        Some(m) => Some(register(m, "open pty")?),
        None => None,
    };
    let stdin = match sp.stdin {
        Some(w) => Some(register(w, "stdin")?),
        None => None,
    };
    let mut outs: Vec<(Fd, Kind)> = Vec::new();
    if let Some(t) = &tty {
        outs.push((t.clone(), Kind::Pty));
    }
    for (f, k) in sp.outs {
        outs.push((register(f, "output")?, k));
    }
    let p = Arc::new(Proc {
        pid,
        tag: spec.tag.clone(),
        info: ConfigOut {
            cmd: spec.cmd.clone(),
            args: spec.args.clone(),
            envs: spec.req_envs.clone(),
            cwd: spec.dir.clone(),
        },
        tty: Mutex::new(tty),
        stdin: Mutex::new(stdin),
        write_lock: tokio::sync::Mutex::new(()),
        events,
        stopping: watch::channel(false).0,
        done: watch::channel(false).0,
        end: Mutex::new(None),
        cg,
    });
    svc.register(&p);
    svc.leftovers.forget(pid as i32);
    log!(st.log, Info, "process started", "service" => "process", "pid" => pid, "cmd" => spec.cmd,
        "args" => go_quote_list(&spec.args), "user" => spec.user.name, "cwd" => spec.dir, "pty" => spec.pty.is_some(),
        "tag" => spec.tag.clone().unwrap_or_default(), "timeout" => timeout.as_nanos());
    tokio::spawn(run(st.clone(), p.clone(), outs, sp.status, timeout));
    Ok((p, sub))
}

/// register puts a non-blocking descriptor on the runtime's poller.
fn register(fd: OwnedFd, what: &str) -> Result<Fd, Error> {
    // SAFETY: the AsyncFd owns fd, so it stays open while registered.
    match unsafe { AsyncFd::register(fd) } {
        Ok(f) => Ok(Arc::new(f)),
        Err(e) => Err(Error::io(what, e.into())),
    }
}

/// go_quote_list renders args as Go's %q of a []string.
fn go_quote_list(args: &[String]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

async fn wait_true(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// run owns a started command until its end event is out.
async fn run(
    st: Arc<State>,
    p: Arc<Proc>,
    outs: Vec<(Fd, Kind)>,
    status: tokio::sync::oneshot::Receiver<i32>,
    timeout: Duration,
) {
    let readers: Vec<tokio::task::JoinHandle<()>> = outs
        .into_iter()
        .map(|(f, k)| tokio::spawn(forward(p.clone(), f, k)))
        .collect();
    let aborts: Vec<tokio::task::AbortHandle> = readers.iter().map(|h| h.abort_handle()).collect();
    let mut drained = Box::pin(async move {
        for r in readers {
            let _ = r.await;
        }
    });

    // The lifetime: a timeout or envd's shutdown kills the process group.
    let life = {
        let p = p.clone();
        let mut closing = st.process.closing.subscribe();
        tokio::spawn(async move {
            let limit = async {
                if timeout.is_zero() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(timeout).await
                }
            };
            tokio::select! {
                _ = limit => {}
                _ = wait_true(&mut closing) => {}
            }
            let _ = p.signal(libc::SIGKILL);
        })
    };
    // The starting client's backpressure ends once the process was told
    // to stop (after the drain grace) or at envd's shutdown.
    let release = {
        let p = p.clone();
        let mut closing = st.process.closing.subscribe();
        let mut stopping = p.stopping.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = wait_true(&mut closing) => {}
                _ = wait_true(&mut stopping) => {
                    tokio::select! {
                        _ = tokio::time::sleep(DRAIN_GRACE) => {}
                        _ = wait_true(&mut closing) => {}
                    }
                }
            }
            p.events.release();
        })
    };

    let ws = status.await;
    p.close_stdin();
    let mut stopping = p.stopping.subscribe();
    tokio::select! {
        _ = &mut drained => {}
        _ = wait_true(&mut stopping) => {
            if tokio::time::timeout(DRAIN_GRACE, &mut drained).await.is_err() {
                for a in &aborts {
                    a.abort();
                }
            }
        }
    }
    let left = Leftover {
        sid: p.pid as i32,
        cg: p.cg.clone(),
    };
    if *p.stopping.borrow() {
        // Off the runtime (it sleeps between passes); inline when no thread
        // can be had (a bomb holds every pid): the sweep is what frees them.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Arc::new(Mutex::new(Some(left)));
        let j = job.clone();
        let spawned = std::thread::Builder::new().name("sweep".into()).spawn(move || {
            if let Some(l) = j.lock().unwrap().take() {
                l.end();
            }
            let _ = tx.send(());
        });
        match spawned {
            Ok(_) => {
                let _ = rx.await;
            }
            Err(_) => {
                if let Some(l) = job.lock().unwrap().take() {
                    l.end();
                }
            }
        }
    } else {
        // Watched off the runtime for a second; without a thread, only
        // remembered (a start's check or sweep still finds it).
        let sessions = st.process.leftovers.clone();
        let job = Arc::new(Mutex::new(Some(left)));
        let j = job.clone();
        let s2 = sessions.clone();
        let spawned = std::thread::Builder::new().name("leftovers".into()).spawn(move || {
            if let Some(l) = j.lock().unwrap().take() {
                s2.add(l);
            }
        });
        if spawned.is_err() {
            if let Some(l) = job.lock().unwrap().take() {
                sessions.remember(l);
            }
        }
    }
    life.abort();
    release.abort();
    p.tty.lock().unwrap().take();

    let end = match ws {
        Ok(ws) => {
            let x = ExitInfo::from_wait_status(ws);
            // Go's cmd.Wait fails with the ProcessState's text unless the
            // command exited with 0.
            let error = (!(x.exited && x.code == 0)).then(|| x.status.clone());
            EndInfo {
                exit_code: x.code,
                exited: x.exited,
                status: x.status,
                error,
            }
        }
        Err(_) => {
            let msg = "wait: no child processes".to_string();
            EndInfo {
                exit_code: -1,
                exited: false,
                status: msg.clone(),
                error: Some(msg),
            }
        }
    };
    log!(st.log, Info, "process ended", "service" => "process", "pid" => p.pid,
        "tag" => p.tag.clone().unwrap_or_default(), "exit_code" => end.exit_code, "exited" => end.exited,
        "status" => end.status);
    *p.end.lock().unwrap() = Some(end.clone());
    p.events.finish(Event::End(end)).await;
    p.done.send_replace(true);
    st.process.retire(&st, &p);
}

/// forward publishes each read as soon as it returns, until EOF, a PTY
/// hang-up (EIO) or an error.
async fn forward(p: Arc<Proc>, f: Fd, kind: Kind) {
    let mut buf = vec![0u8; CHUNK_SIZE];
    loop {
        let n = {
            let Ok(mut guard) = f.readable().await else {
                return;
            };
            match guard.try_io(|fd| spawn::read_fd(fd, &mut buf)) {
                Ok(Ok(0)) => return,
                Ok(Ok(n)) => n,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(Err(_)) => return,
                Err(_) => continue,
            }
        };
        p.events
            .publish(Event::Data(kind, Bytes::copy_from_slice(&buf[..n])))
            .await;
    }
}

/// stream_events sends p's events to one reader: start, data as it comes
/// with keepalives while idle, then the end. sub is None when p has ended.
/// The client leaving ends the stream, not the process.
async fn stream_events(
    st: Arc<State>,
    p: Arc<Proc>,
    sub: Option<Subscription<Event>>,
    s: Stream,
    interval: Duration,
    deadline: Option<Instant>,
) {
    if s.send(&start_msg(p.pid)).await.is_err() {
        return;
    }
    let Some(mut sub) = sub else {
        let end = p.end_info().await;
        if s.send(&event_msg(&Event::End(end))).await.is_ok() {
            s.end(None).await;
        }
        return;
    };
    let dl = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(dl);
    loop {
        tokio::select! {
            _ = s.closed() => return,
            _ = &mut dl => {
                s.end(Some(&deadline_exceeded(""))).await;
                return;
            }
            _ = tokio::time::sleep(interval) => {
                if s.send(&keepalive_msg()).await.is_err() {
                    return;
                }
            }
            ev = sub.rx.recv() => {
                // The deadline wins over a timed-out process's end event.
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    s.end(Some(&deadline_exceeded(""))).await;
                    return;
                }
                match ev {
                    None => {
                        if sub.overflowed() {
                            let e = Error::new(Code::ResourceExhausted, format!(
                                "process {}: resource exhausted: reader fell too far behind the process output", p.pid));
                            log!(st.log, Warn, "process reader disconnected", "service" => "process", "pid" => p.pid,
                                "err" => "resource exhausted: reader fell too far behind the process output");
                            s.end(Some(&e)).await;
                            return;
                        }
                        // Ended without the end event (a full buffer): send it.
                        let end = p.end_info().await;
                        if s.send(&event_msg(&Event::End(end))).await.is_ok() {
                            s.end(None).await;
                        }
                        return;
                    }
                    Some(ev) => {
                        if s.send(&event_msg(&ev)).await.is_err() {
                            return;
                        }
                        if matches!(ev, Event::End(_)) {
                            s.end(None).await;
                            return;
                        }
                    }
                }
            }
        }
    }
}

async fn list_rpc(st: Arc<State>, req: Request) -> Response {
    connect::serve_unary(req, |_, _: serde_json::Value| async move {
        let processes = st
            .process
            .running()
            .iter()
            .map(|p| ProcessInfo {
                config: p.info.clone(),
                pid: p.pid,
                tag: p.tag.clone(),
            })
            .collect();
        Ok(ListResponse { processes })
    })
    .await
}

async fn send_input(p: &Proc, input: &Option<InputIn>, deadline: Option<Instant>) -> Result<(), Error> {
    let input = input.clone().unwrap_or_default();
    let (data, is_pty) = match (input.stdin, input.pty) {
        (Some(d), _) => (decode_b64(&d)?, false),
        (None, Some(d)) => (decode_b64(&d)?, true),
        _ => return Err(invalid("input needs stdin or pty bytes")),
    };
    let f = p.input(is_pty)?;
    p.write(f, &data, deadline).await
}

async fn send_input_rpc(st: Arc<State>, req: Request) -> Response {
    let arrived = Instant::now();
    connect::serve_unary(req, |parts, msg: SendInputRequest| async move {
        let deadline = connect::timeout(&parts).map(|d| arrived + d);
        let p = st.process.lookup_running(&msg.process)?;
        send_input(&p, &msg.input, deadline).await?;
        Ok(Empty {})
    })
    .await
}

async fn stream_input_rpc(st: Arc<State>, req: Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = req.into_parts();
    if !connect::is_stream_request(&parts) || connect::header(&parts, "content-type").contains("proto") {
        return connect::unsupported_media(&parts);
    }
    let deadline = connect::timeout(&parts).map(|d| arrived + d);
    let mut rd = connect::EnvelopeReader::new(body);
    let r = async {
        let mut p: Option<Arc<Proc>> = None;
        while let Some(m) = rd.next::<StreamInputRequest>().await {
            let m = m?;
            if let Some(s) = m.start {
                p = Some(st.process.lookup_running(&s.process)?);
            } else if let Some(d) = m.data {
                let Some(p) = &p else {
                    return Err(invalid("input stream must begin with a start event"));
                };
                send_input(p, &d.input, deadline).await?;
            } else if m.keepalive.is_none() {
                return Err(invalid("input stream event is empty"));
            }
        }
        Ok(())
    }
    .await;
    let mut s = Stream::start(2);
    let resp = s.response();
    match r {
        Ok(()) => {
            let _ = s.send(&Empty {}).await;
            s.end(None).await;
        }
        Err(e) => s.end(Some(&e)).await,
    }
    resp
}

async fn send_signal_rpc(st: Arc<State>, req: Request) -> Response {
    connect::serve_unary(req, |_, msg: SendSignalRequest| async move {
        let sig = match msg.signal.number() {
            9 => libc::SIGKILL,
            15 => libc::SIGTERM,
            _ => return Err(invalid(format!("unsupported signal {}", msg.signal.name()))),
        };
        let p = st.process.lookup_running(&msg.process)?;
        p.signal(sig).map_err(|e| Error {
            message: format!("signal process {}: {}", p.pid, e.message),
            ..e
        })?;
        Ok(Empty {})
    })
    .await
}

async fn update_rpc(st: Arc<State>, req: Request) -> Response {
    connect::serve_unary(req, |_, msg: UpdateRequest| async move {
        let p = st.process.lookup_running(&msg.process)?;
        if let Some(pty) = &msg.pty {
            let Some(t) = p.tty() else {
                return Err(precondition(format!("process {} has no PTY to resize", p.pid)));
            };
            let (cols, rows) = pty.size();
            if let Err(mut e) = spawn::set_winsize(&t, cols, rows) {
                if p.finished() {
                    e = p.err_exited();
                }
                return Err(Error {
                    message: format!("resize pty of process {}: {}", p.pid, e.message),
                    ..e
                });
            }
        }
        Ok(Empty {})
    })
    .await
}

async fn close_stdin_rpc(st: Arc<State>, req: Request) -> Response {
    connect::serve_unary(req, |_, msg: CloseStdinRequest| async move {
        let p = st.process.lookup_running(&msg.process)?;
        if p.tty().is_some() {
            return Err(precondition(format!(
                "process {} has a PTY; send Ctrl-D (0x04) as pty input instead",
                p.pid
            )));
        }
        p.close_stdin();
        Ok(Empty {})
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes() {
        assert_eq!(lifetime("").unwrap(), Duration::ZERO);
        assert_eq!(lifetime("0").unwrap(), Duration::ZERO);
        assert_eq!(lifetime("1500").unwrap(), Duration::from_millis(1500));
        assert_eq!(
            lifetime("-1").unwrap_err().message,
            "invalid argument: Connect-Timeout-Ms \"-1\""
        );
        assert!(lifetime("x").is_err());
    }

    fn test_state() -> Arc<State> {
        crate::state::for_test()
    }

    fn parts(timeout_ms: Option<u64>) -> Parts {
        let mut b = hyper::Request::builder();
        if let Some(t) = timeout_ms {
            b = b.header("connect-timeout-ms", t.to_string());
        }
        b.body(()).unwrap().into_parts().0
    }

    fn request(script: &str) -> StartRequest {
        connect::decode(
            serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "stdin": false})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    async fn collect(sub: &mut Subscription<Event>) -> (Vec<u8>, Vec<u8>, EndInfo) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(ev) = sub.rx.recv().await {
            match ev {
                Event::Data(Kind::Stdout, b) => out.extend_from_slice(&b),
                Event::Data(_, b) => err.extend_from_slice(&b),
                Event::End(e) => return (out, err, e),
            }
        }
        panic!("no end event");
    }

    // Starts real commands as root, which needs root.
    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn start_streams_output_and_end() {
        if !is_root() {
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let st = test_state();
            let s2 = st.clone();
            tokio::spawn(async move { s2.reaper.run().await });
            let (p, mut sub) = start(&st, request("echo out; echo err >&2; exit 3"), &parts(None))
                .await
                .unwrap();
            let (out, err, end) = collect(&mut sub).await;
            assert_eq!((out.as_slice(), err.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
            assert_eq!(
                (end.exit_code, end.exited, end.status.as_str()),
                (3, true, "exit status 3")
            );
            assert_eq!(end.error.as_deref(), Some("exit status 3"));
            assert!(p.finished());
            // Retained: found, but not running.
            let sel = Some(Selector {
                pid: Some(p.pid),
                tag: None,
            });
            assert!(st.process.lookup(&sel).is_ok());
            assert_eq!(
                st.process.lookup_running(&sel).err().map(|e| e.code),
                Some(Code::NotFound)
            );

            // A lifetime ends the command and its whole session.
            let t0 = std::time::Instant::now();
            let (p, mut sub) = start(&st, request("sleep 30 & sleep 31"), &parts(Some(300)))
                .await
                .unwrap();
            let (_, _, end) = collect(&mut sub).await;
            assert_eq!(end.status, "signal: killed");
            assert!(t0.elapsed() < Duration::from_secs(5));
            assert!(sweep::session_members(p.pid as i32).0.is_empty());
        });
    }

    #[test]
    fn quoted_args() {
        assert_eq!(
            go_quote_list(&["-l".into(), "-c".into(), "echo \"hi\"".into()]),
            r#"["-l" "-c" "echo \"hi\""]"#
        );
        assert_eq!(go_quote_list(&[]), "[]");
    }
}
