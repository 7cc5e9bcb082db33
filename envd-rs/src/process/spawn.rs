//! How a command starts (start.go's spawnSpec, process.go's spawn): who
//! runs what, where, with which environment; pipes or a PTY; a session of
//! its own; its own cgroup from before its execve; the reaper's wait.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use hyper::http::request::Parts;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::cgroup::Cgroup;
use super::wire::StartRequest;
use super::{invalid, not_found, Kind};
use crate::error::Error;
use crate::state::State;
use crate::user::{self, User};

/// Used when envd itself runs without PATH.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// What envd starts is the kernel's preferred OOM victim, envd the last.
const CHILD_OOM_SCORE_ADJ: &str = "500";

/// Spec is a validated Start request.
pub struct Spec {
    pub cmd: String,
    pub args: Vec<String>,
    pub req_envs: BTreeMap<String, String>,
    /// The executable, resolved against the child's PATH.
    pub path: String,
    pub env: Vec<(String, String)>,
    pub dir: String,
    pub user: Arc<User>,
    /// (cols, rows) with a PTY.
    pub pty: Option<(u32, u32)>,
    pub stdin: bool,
    pub tag: Option<String>,
}

/// spec validates msg and resolves who runs what, where, with which env.
pub fn spec(st: &State, msg: &StartRequest, parts: &Parts) -> Result<Spec, Error> {
    let Some(cfg) = &msg.process else {
        return Err(invalid("process config is required"));
    };
    let cmd = cfg.cmd.clone().unwrap_or_default();
    if cmd.is_empty() {
        return Err(invalid("process cmd is required"));
    }
    let args = cfg.args.clone().unwrap_or_default();
    if args.iter().any(|a| a.contains('\0')) {
        return Err(invalid("argument contains a NUL byte"));
    }
    let u = st.rpc_user(parts)?;
    let defaults = st.defaults();
    let dir = user::resolve_path(cfg.cwd.as_deref().unwrap_or(""), &u, &defaults.workdir)?;
    let dir = dir.to_string_lossy().into_owned();
    match std::fs::metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(invalid(format!("cwd {dir:?} does not exist"))),
        Err(e) => return Err(Error::io(format!("cwd {dir:?}"), e)),
        Ok(m) if !m.is_dir() => return Err(invalid(format!("cwd {dir:?} is not a directory"))),
        Ok(_) => {}
    }
    let req_envs = cfg.envs.clone().unwrap_or_default();
    let env = build_env(&u, &defaults.envs, &req_envs)?;
    let path_env = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let path = look_path(&cmd, path_env, &dir)?;
    let pty = msg.pty.as_ref().map(|p| p.size());
    if let Some((c, r)) = pty {
        if c > 0xFFFF || r > 0xFFFF {
            return Err(invalid(format!("pty size {c}x{r} is too large")));
        }
    }
    Ok(Spec {
        cmd,
        args,
        req_envs,
        path,
        env,
        dir,
        user: u,
        pty,
        // Absent means true: older clients expect an open stdin.
        stdin: msg.stdin.unwrap_or(true),
        tag: msg.tag.clone().filter(|t| !t.is_empty()),
    })
}

/// build_env composes the child's environment: PATH (envd's), HOME, USER,
/// LOGNAME, then the sandbox-wide variables, then the request's.
pub fn build_env(
    u: &User,
    sandbox: &BTreeMap<String, String>,
    request: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, Error> {
    let path = std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.to_string());
    let mut env: Vec<(String, String)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut set = |k: &str, v: &str| match index.get(k) {
        Some(&i) => env[i].1 = v.to_string(),
        None => {
            index.insert(k.to_string(), env.len());
            env.push((k.to_string(), v.to_string()));
        }
    };
    set("PATH", &path);
    set("HOME", &u.home);
    set("USER", &u.name);
    set("LOGNAME", &u.name);
    for m in [sandbox, request] {
        for (k, v) in m {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(invalid(format!("environment variable {k:?}")));
            }
            set(k, v);
        }
    }
    Ok(env)
}

/// look_path finds cmd as the child's shell would: a name without a slash
/// in the child's PATH, anything else relative to dir.
pub fn look_path(cmd: &str, path_env: &str, dir: &str) -> Result<String, Error> {
    use std::os::unix::fs::PermissionsExt;
    if cmd.contains('\0') {
        return Err(invalid("command contains a NUL byte"));
    }
    if cmd.contains('/') {
        if cmd.starts_with('/') {
            return Ok(cmd.to_string());
        }
        return Ok(user::clean(&Path::new(dir).join(cmd)).to_string_lossy().into_owned());
    }
    for d in path_env.split(':') {
        let d = if d.is_empty() { "." } else { d };
        let d = if d.starts_with('/') {
            d.to_string()
        } else {
            format!("{dir}/{d}")
        };
        let c = user::clean(&Path::new(&d).join(cmd));
        if let Ok(m) = std::fs::metadata(&c) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return Ok(c.to_string_lossy().into_owned());
            }
        }
    }
    Err(not_found(format!("executable {cmd:?} not found in PATH")))
}

/// Spawned is a started child: its pid, its wait status to come, and the
/// parent's ends of its stdio (non-blocking).
pub struct Spawned {
    pub pid: i32,
    pub status: oneshot::Receiver<i32>,
    pub outs: Vec<(OwnedFd, Kind)>,
    pub stdin: Option<OwnedFd>,
    pub tty: Option<OwnedFd>,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// pipe is (read end, write end), both close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid out-array of two ints.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblock(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) })?;
    Ok(())
}

/// open_pty opens a terminal pair sized as asked: (master, slave).
fn open_pty(cols: u32, rows: u32) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt returns a fresh descriptor or -1.
    let m = cvt(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: m is fresh and ours.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    // SAFETY: grantpt/unlockpt on our master.
    cvt(unsafe { libc::grantpt(m) })?;
    cvt(unsafe { libc::unlockpt(m) })?;
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: name is a writable buffer of the given length.
    let r = unsafe { libc::ptsname_r(m, name.as_mut_ptr(), name.len()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    // SAFETY: ptsname_r wrote a NUL-terminated path.
    let s = cvt(unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: s is fresh and ours.
    let slave = unsafe { OwnedFd::from_raw_fd(s) };
    winsize(m, cols, rows)?;
    set_nonblock(&master)?;
    Ok((master, slave))
}

fn winsize(fd: RawFd, cols: u32, rows: u32) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows as u16,
        ws_col: cols as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// set_winsize resizes a PTY.
pub fn set_winsize(t: &AsyncFd<OwnedFd>, cols: u32, rows: u32) -> Result<(), Error> {
    if cols > 0xFFFF || rows > 0xFFFF {
        return Err(invalid(format!("pty size {cols}x{rows} is too large")));
    }
    winsize(t.get_ref().as_raw_fd(), cols, rows).map_err(|e| Error::io("ioctl", e))
}

pub fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::read(fd.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub fn write_fd(fd: &AsyncFd<OwnedFd>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is readable for its length.
    let n = unsafe { libc::write(fd.get_ref().as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// ExecArgs is execve's arguments, built before the fork (the child may
/// not allocate).
struct ExecArgs {
    path: CString,
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into _strings, which the struct owns and never
// changes; they are only read (in the forked child).
unsafe impl Send for ExecArgs {}
unsafe impl Sync for ExecArgs {}

impl ExecArgs {
    fn new(spec: &Spec) -> io::Result<ExecArgs> {
        let nul = |_| io::Error::from_raw_os_error(libc::EINVAL);
        let path = CString::new(spec.path.as_bytes()).map_err(nul)?;
        let mut strings = Vec::new();
        strings.push(CString::new(spec.cmd.as_bytes()).map_err(nul)?);
        for a in &spec.args {
            strings.push(CString::new(a.as_bytes()).map_err(nul)?);
        }
        let nargs = strings.len();
        for (k, v) in &spec.env {
            strings.push(CString::new(format!("{k}={v}")).map_err(nul)?);
        }
        let mut argv: Vec<*const libc::c_char> = strings[..nargs].iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = strings[nargs..].iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());
        Ok(ExecArgs {
            path,
            _strings: strings,
            argv,
            envp,
        })
    }
}

/// spawn starts the child of spec (in cg when given) through the reaper.
/// On error nothing is left open or running.
pub fn spawn(st: &State, spec: &Spec, cg: Option<&Cgroup>) -> io::Result<Spawned> {
    // The pre_exec hook ends in its own execve (ExecArgs): the Command
    // only forks and wires stdio.
    let mut c = Command::new(&spec.path);
    let mut outs = Vec::new();
    let mut stdin = None;
    let mut tty = None;
    match spec.pty {
        Some((cols, rows)) => {
            let (m, s) = open_pty(cols, rows)?;
            c.stdin(Stdio::from(s.try_clone()?))
                .stdout(Stdio::from(s.try_clone()?))
                .stderr(Stdio::from(s));
            tty = Some(m);
        }
        None => {
            let (r, w) = pipe()?;
            set_nonblock(&r)?;
            c.stdout(Stdio::from(w));
            outs.push((r, Kind::Stdout));
            let (r, w) = pipe()?;
            set_nonblock(&r)?;
            c.stderr(Stdio::from(w));
            outs.push((r, Kind::Stderr));
            if spec.stdin {
                let (r, w) = pipe()?;
                set_nonblock(&w)?;
                c.stdin(Stdio::from(r));
                stdin = Some(w);
            } else {
                c.stdin(Stdio::null());
            }
        }
    }
    let dir = CString::new(spec.dir.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let cg_fd = cg.map(|c| c.procs_fd()).transpose()?;
    let cg_raw = cg_fd.as_ref().map(|f| f.as_raw_fd());
    // A non-root envd (development) can only run commands as itself.
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let cred = if euid != 0 && spec.user.uid == euid {
        None
    } else {
        let groups: Vec<libc::gid_t> = spec.user.groups.clone();
        Some((spec.user.uid, spec.user.gid, groups))
    };
    let is_pty = spec.pty.is_some();
    let exec = ExecArgs::new(spec)?;
    // SAFETY: the hook runs in the forked child and only makes system calls
    // on memory prepared before the fork.
    unsafe {
        c.pre_exec(move || {
            // A session of its own: signals and timeouts reach everything a
            // shell started, too.
            cvt(libc::setsid())?;
            if is_pty {
                // The PTY (fd 0) becomes the controlling terminal.
                cvt(libc::ioctl(0, libc::TIOCSCTTY, 0))?;
            }
            if let Some(fd) = cg_raw {
                // Into its cgroup before its first instruction of its own.
                if libc::write(fd, b"0".as_ptr().cast(), 1) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some((uid, gid, groups)) = &cred {
                cvt(libc::setgroups(groups.len(), groups.as_ptr()))?;
                cvt(libc::setgid(*gid))?;
                cvt(libc::setuid(*uid))?;
            }
            cvt(libc::chdir(dir.as_ptr()))?;
            // execve itself, as Go does: execvp (std's) would run a file
            // without a #! line through /bin/sh instead of failing.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let e = &exec; // the whole struct, not its fields (which are not Send)
            libc::execve(e.path.as_ptr(), e.argv.as_ptr(), e.envp.as_ptr());
            Err(io::Error::last_os_error())
        });
    }
    let (pid, status) = st.reaper.spawn(|| c.spawn().map(|ch| ch.id() as i32))?;
    // The child's ends close with the command.
    drop(c);
    drop(cg_fd);
    let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), CHILD_OOM_SCORE_ADJ);
    Ok(Spawned {
        pid,
        status,
        outs,
        stdin,
        tty,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn u() -> User {
        user::test_user()
    }

    #[test]
    fn env_order_and_overrides() {
        let sandbox = BTreeMap::from([
            ("B".to_string(), "2".to_string()),
            ("HOME".to_string(), "/h".to_string()),
        ]);
        let req = BTreeMap::from([("B".to_string(), "3".to_string()), ("A".to_string(), "1".to_string())]);
        let env = build_env(&u(), &sandbox, &req).unwrap();
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["PATH", "HOME", "USER", "LOGNAME", "B", "A"]);
        assert_eq!(env[1].1, "/h");
        assert_eq!(env[4].1, "3");
        let bad = BTreeMap::from([("A=B".to_string(), "1".to_string())]);
        assert_eq!(
            build_env(&u(), &bad, &BTreeMap::new()).unwrap_err().message,
            "invalid argument: environment variable \"A=B\""
        );
    }

    #[test]
    fn paths() {
        assert_eq!(look_path("sh", "/nonexistent:/bin", "/").unwrap(), "/bin/sh");
        assert_eq!(look_path("./x", "", "/tmp").unwrap(), "/tmp/x");
        assert_eq!(look_path("/bin/x", "", "/tmp").unwrap(), "/bin/x");
        let e = look_path("no-such-command-here", "/bin", "/").unwrap_err();
        assert_eq!(e.code, Code::NotFound);
        assert_eq!(
            e.message,
            "not found: executable \"no-such-command-here\" not found in PATH"
        );
    }
}
