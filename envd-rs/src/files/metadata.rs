//! User metadata of files as extended attributes under "user.e2b."
//! (envd/internal/metadata), as E2B's envd reads X-Metadata-* upload headers.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::Error;

pub const PREFIX: &str = "user.e2b.";
const MAX_KEY_LEN: usize = 246;
const MAX_TOTAL_LEN: usize = 4096;

pub type Metadata = BTreeMap<String, String>;

/// validate checks keys and values: printable ASCII, key length, total size.
pub fn validate(m: &Metadata) -> Result<(), Error> {
    let mut total = 0;
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_KEY_LEN {
            return Err(Error::invalid(format!("invalid metadata: key {k:?} length")));
        }
        if !printable(k) || !printable(v) {
            return Err(Error::invalid(format!(
                "invalid metadata: key {k:?}: only printable ASCII is allowed"
            )));
        }
        total += k.len() + v.len();
    }
    if total > MAX_TOTAL_LEN {
        return Err(Error::invalid(format!(
            "invalid metadata: {total} bytes, at most {MAX_TOTAL_LEN}"
        )));
    }
    Ok(())
}

fn printable(s: &str) -> bool {
    s.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn is_notsup(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOTSUP)
}

/// read is the metadata of path (not following a final symlink); a
/// filesystem without xattrs reads as none.
pub fn read(path: &Path) -> io::Result<Metadata> {
    let c = cpath(path)?;
    let mut out = Metadata::new();
    // SAFETY: c is NUL-terminated; a null buffer of size 0 asks the size.
    let size = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        let e = io::Error::last_os_error();
        return if is_notsup(&e) { Ok(out) } else { Err(e) };
    }
    if size == 0 {
        return Ok(out);
    }
    let mut buf = vec![0u8; size as usize];
    // SAFETY: buf has buf.len() writable bytes.
    let size = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if size < 0 {
        return Err(io::Error::last_os_error());
    }
    for name in buf[..size as usize].split(|&b| b == 0) {
        let Some(key) = name.strip_prefix(PREFIX.as_bytes()) else {
            continue;
        };
        if key.is_empty() {
            continue;
        }
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        let mut val = vec![0u8; MAX_TOTAL_LEN];
        // SAFETY: both strings are NUL-terminated; val has val.len() bytes.
        let n = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                val.as_mut_ptr() as *mut libc::c_void,
                val.len(),
            )
        };
        if n < 0 {
            continue; // removed between list and get
        }
        out.insert(
            String::from_utf8_lossy(key).into_owned(),
            String::from_utf8_lossy(&val[..n as usize]).into_owned(),
        );
    }
    Ok(out)
}

/// replace makes m the whole metadata of path. ENOTSUP comes back as is.
pub fn replace(path: &Path, m: &Metadata) -> io::Result<()> {
    let c = cpath(path)?;
    for k in read(path)?.keys() {
        if m.contains_key(k) {
            continue;
        }
        let name = CString::new(format!("{PREFIX}{k}")).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: both strings are NUL-terminated.
        if unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(e);
            }
        }
    }
    for (k, v) in m {
        let name = CString::new(format!("{PREFIX}{}", k.to_lowercase()))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the strings are NUL-terminated; v's bytes are v.len() long.
        let r = unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr(), v.as_ptr() as *const libc::c_void, v.len(), 0) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let mut m = Metadata::new();
        assert!(validate(&m).is_ok());
        m.insert("k".into(), "v".into());
        assert!(validate(&m).is_ok());
        m.insert("bad".into(), "\u{e9}".into());
        assert_eq!(validate(&m).unwrap_err().http_status(), 400);
        let mut m = Metadata::new();
        m.insert("x".repeat(247), "v".into());
        assert!(validate(&m).is_err());
        let mut m = Metadata::new();
        m.insert("a".into(), "v".repeat(4096));
        assert!(validate(&m).is_err());
    }
}
