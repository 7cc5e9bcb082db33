//! The unary file operations (dir.go, move.go, remove.go, stat.go), as
//! blocking functions that run on a thread with the request user's rights.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Code, Error};
use crate::log::Logger;
use crate::user::{self, User};

use super::entry::{self, EntryInfo, Names};

fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
}

/// list_dir lists a directory down to depth levels, in lexical order,
/// parents before their children. path may be a symlink to a directory;
/// entries are reported under path as given. Symlinks inside are never
/// descended into.
pub fn list_dir(path: &Path, depth: usize, log: &Logger) -> Result<Vec<EntryInfo>, Error> {
    let md = std::fs::metadata(path).map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if !md.is_dir() {
        return Err(Error::invalid(format!(
            "invalid argument: {} is not a directory",
            path.display()
        )));
    }
    let root = std::fs::canonicalize(path).map_err(|e| Error::io(format!("lstat {}", path.display()), e))?;
    let mut l = Lister {
        names: Names::default(),
        entries: Vec::new(),
        log,
    };
    l.walk(&root, path, depth, true)?;
    Ok(l.entries)
}

struct Lister<'a> {
    names: Names,
    entries: Vec<EntryInfo>,
    log: &'a Logger,
}

/// read_dir_sorted is Go's os.ReadDir: the names and d_type-based "is a
/// directory", sorted by name.
pub(super) fn read_dir_sorted(dir: &Path) -> io::Result<Vec<(std::ffi::OsString, bool)>> {
    let mut out = Vec::new();
    for de in std::fs::read_dir(dir)? {
        let de = de?;
        let is_dir = de.file_type().map(|t| t.is_dir()).unwrap_or(false);
        out.push((de.file_name(), is_dir));
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

impl Lister<'_> {
    fn walk(&mut self, dir: &Path, shown: &Path, depth: usize, top: bool) -> Result<(), Error> {
        let des = match read_dir_sorted(dir) {
            Ok(d) => d,
            Err(e) if top => return Err(Error::io(format!("open {}", dir.display()), e)),
            Err(e) => {
                // Unreadable below the top: skipped.
                let e = Error::io(format!("open {}", dir.display()), e);
                crate::log!(self.log, Debug, "list dir: skipping unreadable directory", "service" => "filesystem",
                    "path" => dir.display(), "err" => e.message);
                return Ok(());
            }
        };
        for (name, is_dir) in des {
            let p = dir.join(&name);
            let mut e = match self.names.entry(&p) {
                Ok(e) => e,
                Err(e) if e.code == Code::NotFound => continue, // removed since the listing
                Err(e) => return Err(e),
            };
            let shown_p = shown.join(&name);
            e.path = entry::valid_utf8(shown_p.as_os_str().as_bytes());
            self.entries.push(e);
            if depth > 1 && is_dir {
                self.walk(&p, &shown_p, depth - 1, false)?;
            }
        }
        Ok(())
    }
}

/// make_dir creates path and its missing parents, owned by u. An existing
/// directory is already_exists; any other existing entry, including a
/// dangling symlink, is invalid_argument.
pub fn make_dir(path: &Path, u: &User) -> Result<EntryInfo, Error> {
    match std::fs::metadata(path) {
        Ok(md) if md.is_dir() => {
            return Err(Error::new(
                Code::AlreadyExists,
                format!("already exists: directory {}", path.display()),
            ))
        }
        Ok(_) => {
            return Err(Error::invalid(format!(
                "invalid argument: {} exists and is not a directory",
                path.display()
            )))
        }
        Err(e) if errno(&e) == Some(libc::ENOENT) => {}
        Err(e) => return Err(Error::io(format!("stat {}", path.display()), e)),
    }
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(Error::invalid(format!(
            "invalid argument: {} is a dangling symlink",
            path.display()
        )));
    }
    user::ensure_dir(path, u)?;
    entry::entry_info(path)
}

/// remove deletes a file, a symlink or a whole tree; a missing path is no
/// error (Go's os.RemoveAll).
pub fn remove_all(path: &Path) -> Result<(), Error> {
    // The simple case first, as Go's os.RemoveAll: a file or an empty
    // directory, or nothing there.
    match std::fs::remove_file(path) {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(()),
        Err(_) => {}
    }
    match std::fs::remove_dir(path) {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(()),
        Err(_) => {}
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    match std::fs::File::open(parent) {
        Ok(_) => {}
        Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(()), // so base cannot exist
        Err(e) => return Err(Error::io(format!("open {}", parent.display()), e)),
    }
    remove_tree(path).map_err(|(p, op, e)| Error::io(format!("{op} {}", p.display()), e))
}

type RemoveError = (PathBuf, &'static str, io::Error);

fn remove_tree(path: &Path) -> Result<(), RemoveError> {
    let first = match std::fs::remove_file(path) {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(()),
        Err(e) => e,
    };
    if !matches!(errno(&first), Some(libc::EISDIR | libc::EPERM | libc::EACCES)) {
        return Err((path.to_path_buf(), "unlinkat", first));
    }
    let mut recurse_err: Option<RemoveError> = None;
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => match read_dir_sorted(path) {
            Ok(des) => {
                for (name, _) in des {
                    if let Err(e) = remove_tree(&path.join(name)) {
                        recurse_err.get_or_insert(e);
                    }
                }
            }
            Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(()),
            Err(e) => recurse_err = Some((path.to_path_buf(), "openfdat", e)),
        },
        Ok(_) => return Err((path.to_path_buf(), "unlinkat", first)),
        Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err((path.to_path_buf(), "unlinkat", e)),
    }
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if errno(&e) == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(recurse_err.unwrap_or((path.to_path_buf(), "unlinkat", e))),
    }
}

/// move_entry renames src to dst with Go's os.Rename rules (an existing
/// file is replaced, an existing directory is already_exists), creating
/// dst's missing parents for u, and finishes a cross-filesystem move by
/// copying, as mv(1) does.
pub fn move_entry(src: &Path, dst: &Path, u: &User) -> Result<EntryInfo, Error> {
    std::fs::symlink_metadata(src).map_err(|e| Error::io(format!("lstat {}", src.display()), e))?;
    let parent = dst.parent().unwrap_or(Path::new("/"));
    user::ensure_dir(parent, u)?;
    match rename(src, dst) {
        Ok(()) => {}
        Err(e) if errno(&e) == Some(libc::EXDEV) => move_across(src, dst)?,
        Err(e) => return Err(Error::io(format!("rename {} {}", src.display(), dst.display()), e)),
    }
    entry::entry_info(dst)
}

/// rename is Go's os.Rename: renaming onto an existing directory that is
/// not the source itself is EEXIST.
fn rename(src: &Path, dst: &Path) -> io::Result<()> {
    if let Ok(d) = std::fs::symlink_metadata(dst) {
        if d.is_dir() {
            let s = std::fs::symlink_metadata(src)?;
            if src == dst || (s.dev(), s.ino()) != (d.dev(), d.ino()) {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
        }
    }
    std::fs::rename(src, dst)
}

/// move_across copies src into a temporary directory next to dst, renames
/// the copy onto dst, then removes src; on failure only src remains.
fn move_across(src: &Path, dst: &Path) -> Result<(), Error> {
    if dst == src || dst.starts_with(src) {
        return Err(Error::io(
            format!("move {} into itself", src.display()),
            io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    let parent = dst.parent().unwrap_or(Path::new("/"));
    let tmp =
        make_temp_dir(parent).map_err(|e| Error::io(format!("mkdirtemp {}/.sandboxd-move-*", parent.display()), e))?;
    let staged = tmp.join("entry");
    let r = (|| {
        copy_entry(src, &staged).map_err(|(p, op, e)| {
            Error::io(
                format!("copy {} to {}: {op} {}", src.display(), dst.display(), p.display()),
                e,
            )
        })?;
        rename(&staged, dst).map_err(|e| Error::io(format!("rename {} {}", staged.display(), dst.display()), e))?;
        remove_all(src)
    })();
    let _ = remove_all(&tmp);
    r
}

fn make_temp_dir(parent: &Path) -> io::Result<PathBuf> {
    for _ in 0..100 {
        let mut b = [0u8; 6];
        // SAFETY: getrandom writes at most b.len() bytes into b.
        unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        let n: String = b.iter().map(|x| format!("{x:02x}")).collect();
        let p = parent.join(format!(".sandboxd-move-{n}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EEXIST))
}

use std::os::unix::fs::DirBuilderExt;

fn c(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// copy_entry copies src to the new path dst without following symlinks,
/// keeping type, content, owner, mode, xattrs and timestamps (cp -a).
fn copy_entry(src: &Path, dst: &Path) -> Result<(), RemoveError> {
    fn at(op: &'static str, p: &Path) -> impl FnOnce(io::Error) -> RemoveError {
        let p = p.to_path_buf();
        move |e| (p, op, e)
    }
    let md = std::fs::symlink_metadata(src).map_err(at("lstat", src))?;
    let ft = md.file_type();
    if ft.is_file() {
        copy_file(src, dst)?;
    } else if ft.is_dir() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dst)
            .map_err(at("mkdir", dst))?;
        for (name, _) in read_dir_sorted(src).map_err(at("open", src))? {
            copy_entry(&src.join(&name), &dst.join(&name))?;
        }
    } else if ft.is_symlink() {
        let t = std::fs::read_link(src).map_err(at("readlink", src))?;
        std::os::unix::fs::symlink(t, dst).map_err(at("symlink", dst))?;
    } else {
        let cd = c(dst).map_err(at("mknod", dst))?;
        // SAFETY: cd is NUL-terminated.
        check(unsafe { libc::mknod(cd.as_ptr(), md.mode(), md.rdev()) }).map_err(at("mknod", dst))?;
    }
    // chown before chmod: chown clears setuid bits. A user may not give
    // files away: the copy is then theirs, as with mv(1) run by them.
    match std::os::unix::fs::lchown(dst, Some(md.uid()), Some(md.gid())) {
        Err(e) if errno(&e) != Some(libc::EPERM) => return Err((dst.to_path_buf(), "lchown", e)),
        _ => {}
    }
    let cd = c(dst).map_err(at("chmod", dst))?;
    if !ft.is_symlink() {
        // SAFETY: cd is NUL-terminated.
        check(unsafe { libc::chmod(cd.as_ptr(), md.mode() & 0o7777) }).map_err(at("chmod", dst))?;
    }
    copy_xattrs(src, dst);
    let ts = [
        libc::timespec {
            tv_sec: md.atime() as _,
            tv_nsec: md.atime_nsec() as _,
        },
        libc::timespec {
            tv_sec: md.mtime() as _,
            tv_nsec: md.mtime_nsec() as _,
        },
    ];
    // SAFETY: cd is NUL-terminated and ts holds two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, cd.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
        .map_err(at("utimensat", dst))
}

fn copy_file(src: &Path, dst: &Path) -> Result<(), RemoveError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut inp = std::fs::File::open(src).map_err(|e| (src.to_path_buf(), "open", e))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(|e| (dst.to_path_buf(), "open", e))?;
    std::io::copy(&mut inp, &mut out).map_err(|e| (dst.to_path_buf(), "write", e))?;
    out.sync_all().ok();
    Ok(())
}

/// copy_xattrs is best effort, like cp -a.
fn copy_xattrs(src: &Path, dst: &Path) {
    let Ok(names) = crate::xattr::llistxattr(src) else {
        return;
    };
    let (Ok(cs), Ok(cd)) = (c(src), c(dst)) else {
        return;
    };
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(cn) = CString::new(name) else { continue };
        // SAFETY: NUL-terminated strings; a NULL buffer of size 0 asks the size.
        let n = unsafe { libc::lgetxattr(cs.as_ptr(), cn.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            continue;
        }
        let mut v = vec![0u8; n as usize];
        // SAFETY: v has v.len() bytes.
        let n = unsafe { libc::lgetxattr(cs.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if n < 0 {
            continue;
        }
        // SAFETY: v holds at least n bytes.
        unsafe { libc::lsetxattr(cd.as_ptr(), cn.as_ptr(), v.as_ptr().cast(), n as usize, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("envd-rs-ops-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn lg() -> Logger {
        Logger::new(crate::log::Level::Error)
    }

    fn me() -> User {
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        User {
            name: "me".into(),
            uid,
            gid,
            groups: vec![gid],
            home: "/".into(),
        }
    }

    #[test]
    fn list_depth_and_order() {
        let d = tmp("list");
        std::fs::create_dir_all(d.join("b/inner")).unwrap();
        std::fs::write(d.join("a.txt"), "x").unwrap();
        std::fs::write(d.join("b/inner/deep.txt"), "x").unwrap();
        std::os::unix::fs::symlink(d.join("b"), d.join("c")).unwrap();
        let names = |v: Vec<EntryInfo>| v.into_iter().map(|e| e.path).collect::<Vec<_>>();
        let s = d.to_str().unwrap();
        assert_eq!(
            names(list_dir(&d, 1, &lg()).unwrap()),
            vec![format!("{s}/a.txt"), format!("{s}/b"), format!("{s}/c")]
        );
        assert_eq!(
            names(list_dir(&d, 2, &lg()).unwrap()),
            vec![
                format!("{s}/a.txt"),
                format!("{s}/b"),
                format!("{s}/b/inner"),
                format!("{s}/c")
            ]
        );
        // Through a symlink: entries under the path as given.
        let via = names(list_dir(&d.join("c"), 1, &lg()).unwrap());
        assert_eq!(via, vec![format!("{s}/c/inner")]);
        let e = list_dir(&d.join("a.txt"), 1, &lg()).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert_eq!(list_dir(&d.join("nope"), 1, &lg()).unwrap_err().code, Code::NotFound);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn make_dir_cases() {
        let d = tmp("mkdir");
        let e = make_dir(&d.join("x/y"), &me()).unwrap();
        assert_eq!(e.name, "y");
        assert_eq!(make_dir(&d.join("x/y"), &me()).unwrap_err().code, Code::AlreadyExists);
        std::fs::write(d.join("f"), "").unwrap();
        assert_eq!(make_dir(&d.join("f"), &me()).unwrap_err().code, Code::InvalidArgument);
        std::os::unix::fs::symlink("nowhere", d.join("dl")).unwrap();
        assert_eq!(make_dir(&d.join("dl"), &me()).unwrap_err().code, Code::InvalidArgument);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn move_and_remove() {
        let d = tmp("move");
        std::fs::write(d.join("a"), "x").unwrap();
        let e = move_entry(&d.join("a"), &d.join("new/b"), &me()).unwrap();
        assert_eq!(e.name, "b");
        assert_eq!(
            move_entry(&d.join("a"), &d.join("c"), &me()).unwrap_err().code,
            Code::NotFound
        );
        std::fs::create_dir(d.join("dir")).unwrap();
        let err = move_entry(&d.join("new/b"), &d.join("dir"), &me()).unwrap_err();
        assert_eq!(err.code, Code::AlreadyExists);
        assert!(err.message.starts_with("rename "), "{}", err.message);
        // Across filesystems by copying.
        std::fs::create_dir_all(d.join("tree/sub")).unwrap();
        std::fs::write(d.join("tree/sub/f"), "content").unwrap();
        std::os::unix::fs::symlink("sub/f", d.join("tree/l")).unwrap();
        move_across(&d.join("tree"), &d.join("moved")).unwrap();
        assert!(!d.join("tree").exists());
        assert_eq!(std::fs::read_to_string(d.join("moved/sub/f")).unwrap(), "content");
        assert_eq!(std::fs::read_link(d.join("moved/l")).unwrap(), PathBuf::from("sub/f"));
        assert_eq!(
            move_across(&d.join("moved"), &d.join("moved/in")).unwrap_err().code,
            Code::InvalidArgument
        );
        remove_all(&d.join("moved")).unwrap();
        remove_all(&d.join("missing")).unwrap();
        assert!(!d.join("moved").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
