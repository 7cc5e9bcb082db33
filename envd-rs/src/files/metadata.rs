//! User metadata of files as extended attributes under "user.e2b."
//! (envd/internal/metadata), as E2B's envd reads X-Metadata-* upload headers.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::path::Path;

use crate::error::Error;

pub use crate::xattr::PREFIX;
const MAX_KEY_LEN: usize = 246;
use crate::xattr::{self, cpath, MAX_TOTAL as MAX_TOTAL_LEN};

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

/// read is the metadata of path (not following a final symlink); a
/// filesystem without xattrs reads as none.
pub fn read(path: &Path) -> io::Result<Metadata> {
    Ok(xattr::read_user(path)?
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(&k).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect())
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
