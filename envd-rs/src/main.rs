//! envd-rs is sandboxd's in-sandbox agent without a Go runtime: envd's
//! protocol (docs/envd.md) on hyper and tokio's current-thread runtime, one
//! thread serving both listeners, so that a sandbox's start costs its agent
//! about a millisecond of CPU rather than a Go program's five
//! (docs/agent-rust.md). It takes envd's flags; sandboxd runs it with
//! `--envd bin/envd-rs`.

// First: its log! macro is used by the modules below.
#[macro_use]
mod log;

mod connect;
mod error;
mod files;
mod filesystem;
mod http;
mod metrics;
mod pid1;
mod process;
mod reaper;
mod server;
mod state;
mod tunnel;
mod user;
mod xattr;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, UnixListener};

use crate::state::{Config, State};

/// VERSION is the envd protocol version reported (envdapi.Version): E2B's
/// SDKs turn features on by it.
pub const VERSION: &str = "0.6.13";

struct Flags {
    listen: String,
    socket: String,
    socket_fd: i32,
    init: bool,
    default_user: String,
    workdir: String,
    disk: String,
    log_level: String,
    version: bool,
    cgroup: String,
    pids_reserve: u64,
}

/// parse_flags reads Go flag syntax: -name value, --name value,
/// -name=value; booleans take no value (or =true/=false).
fn parse_flags(args: &[String]) -> Result<Flags, String> {
    let mut f = Flags {
        listen: "0.0.0.0:49983".into(),
        socket: String::new(),
        socket_fd: -1,
        init: false,
        default_user: "user".into(),
        workdir: String::new(),
        disk: "/".into(),
        log_level: "info".into(),
        version: false,
        cgroup: "auto".into(),
        pids_reserve: 64,
    };
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            break;
        }
        let Some(name) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
            return Err(format!("unexpected argument {a:?}"));
        };
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        let boolean = |v: Option<String>| -> Result<bool, String> {
            match v.as_deref() {
                None | Some("true") | Some("1") => Ok(true),
                Some("false") | Some("0") => Ok(false),
                Some(o) => Err(format!("invalid boolean value {o:?} for -{name}")),
            }
        };
        match name {
            "init" => f.init = boolean(inline)?,
            "version" => f.version = boolean(inline)?,
            _ => {
                let v = match inline {
                    Some(v) => v,
                    None => {
                        let v = args
                            .get(i)
                            .ok_or_else(|| format!("flag needs an argument: -{name}"))?
                            .clone();
                        i += 1;
                        v
                    }
                };
                match name {
                    "listen" => f.listen = v,
                    "socket" => f.socket = v,
                    "socket-fd" => {
                        f.socket_fd = v
                            .parse()
                            .ok()
                            .filter(|fd| *fd >= 3)
                            .ok_or_else(|| format!("invalid value {v:?} for -socket-fd"))?
                    }
                    "default-user" => f.default_user = v,
                    "workdir" => f.workdir = v,
                    "disk" => f.disk = v,
                    "log-level" => f.log_level = v,
                    "cgroup" => f.cgroup = v,
                    "pids-reserve" => {
                        f.pids_reserve = v
                            .parse()
                            .map_err(|_| format!("invalid value {v:?} for -pids-reserve"))?
                    }
                    _ => return Err(format!("flag provided but not defined: -{name}")),
                }
            }
        }
    }
    Ok(f)
}

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let f = match parse_flags(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("envd: {e}");
            return 2;
        }
    };
    if f.version {
        println!("{VERSION}");
        return 0;
    }
    // The handed-over socket is marked close-on-exec before anything
    // here can start a process: a command must not inherit envd's
    // listener.
    if f.socket_fd >= 0 {
        // SAFETY: fcntl on a descriptor number; a bad one fails with EBADF.
        if unsafe { libc::fcntl(f.socket_fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
            eprintln!("envd: --socket-fd {}: {}", f.socket_fd, std::io::Error::last_os_error());
            return 2;
        }
    }
    if f.init {
        // Before anything can fork.
        if let Err(e) = pid1::become_init() {
            eprintln!("envd init: loopback: {e}");
        }
    }
    let Some(level) = log::Level::parse(&f.log_level) else {
        eprintln!("envd: bad --log-level: {:?}", f.log_level);
        return 2;
    };
    let logger = log::Logger::new(level);
    if f.listen.is_empty() && f.socket.is_empty() && f.socket_fd < 0 {
        log!(logger, Error, "nothing to serve on: set --listen, --socket or --socket-fd");
        return 2;
    }
    let mut default_user = f.default_user.clone();
    if user::lookup(&default_user).is_err() {
        log!(logger, Warn, "default user missing, using root", "user" => default_user);
        default_user = "root".into();
    }
    let cgroup_root = match f.cgroup.as_str() {
        "auto" => f.init.then(|| "/sys/fs/cgroup".to_string()),
        "off" => None,
        p => Some(p.to_string()),
    };
    let cfg = Config {
        default_user: default_user.clone(),
        workdir: f.workdir.clone(),
        disk_path: f.disk.clone(),
        cgroup_root,
        pids_reserve: f.pids_reserve,
    };
    let st = State::new(logger, cfg);

    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("envd: runtime: {e}");
            return 1;
        }
    };
    rt.block_on(serve(st, f, default_user))
}

async fn serve(st: Arc<State>, f: Flags, default_user: String) -> i32 {
    // The socket comes first: it is sandboxd's channel, and its appearance
    // is what sandboxd's readiness probe waits for, so its first request
    // (/init) is answered while the TCP listener is still being set up.
    let mut socket_path = None;
    if !f.socket.is_empty() || f.socket_fd >= 0 {
        let (l, addr) = if f.socket_fd >= 0 {
            (inherited_unix(f.socket_fd), format!("fd {}", f.socket_fd))
        } else {
            (listen_unix(&f.socket), f.socket.clone())
        };
        match l {
            Ok(l) => {
                log!(st.log, Info, "envd serving", "addr" => addr, "version" => VERSION, "default_user" => default_user);
                if f.socket_fd < 0 {
                    socket_path = Some(f.socket.clone());
                }
                let st = st.clone();
                tokio::spawn(async move {
                    loop {
                        if let Ok((s, _)) = l.accept().await {
                            serve_conn(st.clone(), s);
                        }
                    }
                });
            }
            Err(e) => {
                log!(st.log, Error, "listen", "socket" => addr, "err" => e);
                return 1;
            }
        }
    }
    {
        let st = st.clone();
        tokio::spawn(async move { st.reaper.run().await });
    }
    if !f.listen.is_empty() {
        match TcpListener::bind(&f.listen).await {
            Ok(l) => {
                let addr = l
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| f.listen.clone());
                log!(st.log, Info, "envd serving", "addr" => addr, "version" => VERSION, "default_user" => default_user);
                let st = st.clone();
                tokio::spawn(async move {
                    loop {
                        if let Ok((s, _)) = l.accept().await {
                            let _ = s.set_nodelay(true);
                            serve_conn(st.clone(), s);
                        }
                    }
                });
            }
            Err(e) => {
                log!(st.log, Error, "listen", "addr" => f.listen, "err" => e);
                return 1;
            }
        }
    }
    let (mut term, mut int) = match (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()),
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            log!(st.log, Error, "signal handlers could not be set");
            return 1;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    st.process.close();
    st.filesystem.close();
    if let Some(p) = socket_path {
        let _ = std::fs::remove_file(p);
    }
    0
}

fn serve_conn<S>(st: Arc<State>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + AsRawFd + Unpin + Send + 'static,
{
    // A second descriptor of the connection's socket outlives hyper's, for
    // the lingering close below. Close-on-exec: commands must not inherit it.
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor the stream holds open.
    let dup = unsafe { libc::fcntl(stream.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    // SAFETY: a fresh descriptor, ours alone.
    let dup = (dup >= 0).then(|| unsafe { OwnedFd::from_raw_fd(dup) });
    tokio::spawn(async move {
        let upgraded = Arc::new(AtomicBool::new(false));
        let svc = {
            let upgraded = upgraded.clone();
            service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                if req.method() == hyper::Method::CONNECT {
                    upgraded.store(true, Ordering::Relaxed);
                }
                let st = st.clone();
                async move { Ok::<_, std::convert::Infallible>(server::handle(st, req).await) }
            })
        };
        let _ = auto::Builder::new(TokioExecutor::new())
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .await;
        // A tunnel owns the socket now; anything else is closed gently.
        if let (Some(fd), false) = (dup, upgraded.load(Ordering::Relaxed)) {
            linger(fd).await;
        }
    });
}

/// LINGER is how long a closed connection's late bytes are read and
/// dropped (Go's server waits as long, rstAvoidanceDelay).
const LINGER: std::time::Duration = std::time::Duration::from_millis(500);

/// linger closes a connection as Go's server does (closeWriteAndWait):
/// hyper closes one whose request body is still arriving (an upload
/// answered early, 507 or 401), and a plain close with unread bytes sends
/// an RST, which can reach the client (sandboxd's proxy) before the answer
/// does and fail its write with EPIPE: a 502 instead of the 507. So the
/// write side is shut (the answer is out), and what still arrives is read
/// and dropped until the client closes, or for LINGER at most.
async fn linger(fd: OwnedFd) {
    // SAFETY: shutdown of a socket we hold.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) };
    // SAFETY: the AsyncFd owns fd, so it stays open while registered.
    let Ok(afd) = (unsafe { tokio::io::unix::AsyncFd::register(fd) }) else {
        return;
    };
    let mut buf = vec![0u8; 16 << 10];
    let _ = tokio::time::timeout(LINGER, async {
        loop {
            let Ok(mut ready) = afd.readable().await else { return };
            let r = ready.try_io(|f| {
                // SAFETY: buf is writable for its length.
                let n = unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n)
                }
            });
            match r {
                Ok(Ok(0)) | Ok(Err(_)) => return, // the client closed, or an error
                Ok(Ok(_)) | Err(_) => {}          // more to drop, or not ready after all
            }
        }
    })
    .await;
}

/// inherited_unix takes the listening unix socket sandboxd bound on the
/// host and handed over as descriptor fd (--socket-fd), which run has
/// marked close-on-exec: a process envd starts must not hold it, or it
/// could accept sandboxd's connections, and keep the socket alive after
/// envd is gone.
fn inherited_unix(fd: i32) -> std::io::Result<UnixListener> {
    // SAFETY: fd is ours from exec (sandboxd-spawn dup2'd it there), and
    // nothing else in this process uses it (run marked it close-on-exec).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let l = std::os::unix::net::UnixListener::from(owned);
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

/// listen_unix listens on a unix socket that appears at path only once it
/// accepts: bound under a temporary name, then renamed over path. sandboxd
/// waits for the name (inotify) and then asks once.
fn listen_unix(path: &str) -> std::io::Result<UnixListener> {
    let tmp = format!("{path}.{}.tmp", std::process::id());
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp)?;
    l.set_nonblocking(true)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    UnixListener::from_std(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let f = parse_flags(&a(
            "--init --socket /run/envd.sock --listen= -default-user=root --pids-reserve 8",
        ))
        .unwrap();
        assert!(f.init);
        assert_eq!(f.socket, "/run/envd.sock");
        assert_eq!(f.listen, "");
        assert_eq!(f.default_user, "root");
        assert_eq!(f.pids_reserve, 8);
        assert!(parse_flags(&a("--nope")).is_err());
        assert!(parse_flags(&a("--socket")).is_err());
        assert_eq!(parse_flags(&a("--socket-fd 3")).unwrap().socket_fd, 3);
        assert!(parse_flags(&a("--socket-fd 2")).is_err());
        assert!(parse_flags(&a("--socket-fd x")).is_err());
        assert!(!parse_flags(&a("--init=false")).unwrap().init);
    }
}
