//! Users and paths: who a request runs as (its Basic auth or `username`,
//! else the default user), how its paths resolve, and file work done with
//! that user's rights (envd/internal/permissions).

use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use base64::Engine;

use crate::error::{Code, Error};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, the primary gid first.
    pub groups: Vec<u32>,
    pub home: String,
}

pub fn unknown_user(name: &str) -> Error {
    Error::new(Code::Unauthenticated, format!("invalid username: '{name}'")) // E2B envd's words
}

/// lookup reads a user from /etc/passwd and its groups from /etc/group.
pub fn lookup(name: &str) -> Result<User, Error> {
    lookup_in(name, "/etc/passwd", "/etc/group")
}

fn lookup_in(name: &str, passwd: &str, group: &str) -> Result<User, Error> {
    if name.is_empty() {
        return Err(Error::new(Code::Unauthenticated, "invalid username: empty"));
    }
    let passwd = std::fs::read_to_string(passwd).unwrap_or_default();
    let line = passwd
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .ok_or_else(|| unknown_user(name))?;
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 {
        return Err(unknown_user(name));
    }
    let uid: u32 = f[2]
        .parse()
        .map_err(|_| Error::internal(format!("user {name:?}: uid {:?}", f[2])))?;
    let gid: u32 = f[3]
        .parse()
        .map_err(|_| Error::internal(format!("user {name:?}: gid {:?}", f[3])))?;
    let mut groups = vec![gid];
    for l in std::fs::read_to_string(group).unwrap_or_default().lines() {
        let g: Vec<&str> = l.split(':').collect();
        if g.len() < 4 {
            continue;
        }
        if g[3].split(',').any(|m| m == name) {
            if let Ok(id) = g[2].parse::<u32>() {
                if !groups.contains(&id) {
                    groups.push(id);
                }
            }
        }
    }
    let home = if f[5].is_empty() {
        "/".to_string()
    } else {
        f[5].to_string()
    };
    Ok(User {
        name: name.to_string(),
        uid,
        gid,
        groups,
        home,
    })
}

/// basic_auth_user is the user name of an `Authorization: Basic` header:
/// Ok(None) without one, an error when it is malformed.
pub fn basic_auth_user(header: &str) -> Result<Option<String>, Error> {
    if header.is_empty() {
        return Ok(None);
    }
    let Some((scheme, payload)) = header.split_once(' ') else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Ok(None);
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(payload.trim())
        .map_err(|_| Error::new(Code::Unauthenticated, "invalid username: malformed basic auth"))?;
    let s = String::from_utf8_lossy(&raw);
    Ok(Some(s.split_once(':').map(|(n, _)| n).unwrap_or(&s).to_string()))
}

/// resolve_path makes a request's path absolute: empty is the default
/// directory (else home), `~` and `~/x` are under home, a relative path is
/// from home; `~other` is an error.
pub fn resolve_path(path: &str, u: &User, default_dir: &str) -> Result<PathBuf, Error> {
    if path.contains('\0') {
        return Err(Error::invalid("invalid path: NUL byte"));
    }
    let mut p = path.to_string();
    if p.is_empty() {
        p = if default_dir.is_empty() {
            u.home.clone()
        } else {
            default_dir.to_string()
        };
    }
    if let Some(rest) = p.strip_prefix('~') {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(Error::invalid(format!(
                "invalid path: {path:?}: cannot expand another user's home"
            )));
        }
        p = format!("{}/{}", u.home, rest);
    }
    if !p.starts_with('/') {
        p = format!("{}/{}", u.home, p);
    }
    Ok(clean(Path::new(&p)))
}

/// clean is Go's filepath.Clean for absolute paths: no `.`, no `..`, no
/// double or trailing slashes.
pub fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// ensure_dir makes dir and its missing parents, each owned by u (runs as
/// root, like envd's EnsureDir).
pub fn ensure_dir(dir: &Path, u: &User) -> Result<(), Error> {
    let mut missing = Vec::new();
    let mut d = clean(dir);
    loop {
        match std::fs::metadata(&d) {
            Ok(m) => {
                if !m.is_dir() {
                    return Err(Error::invalid(format!(
                        "invalid path: {} is not a directory",
                        d.display()
                    )));
                }
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(d.clone());
                if !d.pop() {
                    break;
                }
            }
            Err(e) => return Err(Error::io(format!("stat {}", d.display()), e)),
        }
    }
    for m in missing.iter().rev() {
        match std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o755).create(m) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("mkdir {}", m.display()), e)),
        }
        std::os::unix::fs::lchown(m, Some(u.uid), Some(u.gid))
            .map_err(|e| Error::io(format!("lchown {}", m.display()), e))?;
    }
    Ok(())
}

/// as_user runs f with u's filesystem rights: on a thread of its own whose
/// fsuid, fsgid and groups are u's (per thread in Linux, so nothing else in
/// envd runs as u), so that u cannot read what u could not, and what f
/// creates is u's from the start. The thread ends with f.
pub async fn as_user<T, F>(u: Arc<User>, f: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Error> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("as-user".into()).spawn(move || {
        let r = match become_user(&u) {
            Ok(()) => f(),
            Err(e) => Err(e),
        };
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        return Err(Error::io("start a thread", e));
    }
    rx.await
        .unwrap_or_else(|_| Err(Error::internal("file work ended without an answer")))
}

/// blocking runs f on a thread of its own, as root (work that must not
/// hold up the event loop).
pub async fn blocking<T, F>(f: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Error> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("blocking".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| Error::io("start a thread", e))?;
    rx.await
        .unwrap_or_else(|_| Err(Error::internal("work ended without an answer")))
}

fn become_user(u: &User) -> Result<(), Error> {
    // SAFETY: getuid has no preconditions.
    if u.uid == 0 || unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let gids: Vec<libc::gid_t> = u.groups.clone();
    // The raw system calls change this thread only; libc's wrappers of
    // setgroups would change every thread of the process.
    // SAFETY: gids outlives the call; the length matches.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, gids.len(), gids.as_ptr()) };
    if r != 0 {
        return Err(Error::io(
            format!("run as {}: setgroups", u.name),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: setfsgid and setfsuid take plain ids; -1 asks the current one.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, u.gid);
        if libc::syscall(libc::SYS_setfsgid, -1i32 as u32) as u32 != u.gid {
            return Err(Error::internal(format!(
                "run as {}: setfsgid({}) did not take",
                u.name, u.gid
            )));
        }
        libc::syscall(libc::SYS_setfsuid, u.uid);
        if libc::syscall(libc::SYS_setfsuid, -1i32 as u32) as u32 != u.uid {
            return Err(Error::internal(format!(
                "run as {}: setfsuid({}) did not take",
                u.name, u.uid
            )));
        }
    }
    Ok(())
}

/// test_user is the sandboxes' default user, for unit tests.
#[cfg(test)]
pub fn test_user() -> User {
    User {
        name: "user".into(),
        uid: 1000,
        gid: 1000,
        groups: vec![1000],
        home: "/home/user".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u() -> User {
        test_user()
    }

    #[test]
    fn paths() {
        let cases = [
            ("", "", "/home/user"),
            ("", "/work", "/work"),
            ("~", "", "/home/user"),
            ("~/a/../b", "", "/home/user/b"),
            ("rel/x", "/work", "/home/user/rel/x"),
            ("/a//b/./c/", "", "/a/b/c"),
            ("/../..", "", "/"),
        ];
        for (p, d, want) in cases {
            assert_eq!(resolve_path(p, &u(), d).unwrap(), PathBuf::from(want), "{p:?}");
        }
        assert!(resolve_path("~root/x", &u(), "").is_err());
        assert!(resolve_path("/a\0b", &u(), "").is_err());
    }

    #[test]
    fn basic_auth() {
        assert_eq!(basic_auth_user("").unwrap(), None);
        assert_eq!(basic_auth_user("Basic dXNlcjo=").unwrap().as_deref(), Some("user"));
        assert_eq!(basic_auth_user("basic cm9vdA==").unwrap().as_deref(), Some("root"));
        assert_eq!(basic_auth_user("Bearer x").unwrap(), None);
        assert!(basic_auth_user("Basic !!!").is_err());
    }

    #[test]
    fn lookup_files() {
        let dir = std::env::temp_dir().join(format!("envd-rs-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (p, g) = (dir.join("passwd"), dir.join("group"));
        std::fs::write(
            &p,
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nnohome:x:7:7::::\n",
        )
        .unwrap();
        std::fs::write(&g, "user:x:1000:\nsudo:x:27:user,other\ndocker:x:999:other\n").unwrap();
        let got = lookup_in("user", p.to_str().unwrap(), g.to_str().unwrap()).unwrap();
        assert_eq!(got.groups, vec![1000, 27]);
        assert_eq!(got.home, "/home/user");
        assert_eq!(
            lookup_in("nohome", p.to_str().unwrap(), g.to_str().unwrap())
                .unwrap()
                .home,
            "/"
        );
        let e = lookup_in("nobody", p.to_str().unwrap(), g.to_str().unwrap()).unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
