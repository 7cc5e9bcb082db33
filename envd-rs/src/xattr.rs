//! Extended attributes: the user metadata E2B keeps under "user.e2b."
//! (envd/internal/metadata), read by the filesystem service's entries and
//! written and read by /files.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// PREFIX is the xattr namespace of user metadata; keys are
/// exposed without it.
pub const PREFIX: &str = "user.e2b.";
pub const MAX_TOTAL: usize = 4096;

pub fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// read_user is the metadata of path (not following a final symlink):
/// key → value, raw bytes. A filesystem without xattrs reads as none.
pub fn read_user(path: &Path) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let names = match llistxattr(path) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(e),
    };
    let c = cpath(path)?;
    for name in names.split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(PREFIX.as_bytes()) else {
            continue;
        };
        if key.is_empty() {
            continue;
        }
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        let mut val = vec![0u8; MAX_TOTAL];
        // SAFETY: the strings are NUL-terminated and val has val.len() bytes.
        let n = unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if n < 0 {
            continue; // removed between list and get
        }
        val.truncate(n as usize);
        out.insert(key.to_vec(), val);
    }
    Ok(out)
}

/// llistxattr lists the xattr names of path, NUL-separated.
pub fn llistxattr(path: &Path) -> io::Result<Vec<u8>> {
    let c = cpath(path)?;
    loop {
        // SAFETY: a NULL buffer of size 0 asks the size.
        let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; n as usize];
        // SAFETY: buf has buf.len() bytes.
        let m = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if m < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ERANGE) {
                continue; // grew meanwhile
            }
            return Err(e);
        }
        buf.truncate(m as usize);
        return Ok(buf);
    }
}
