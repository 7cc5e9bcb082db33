//! EntryInfo as envd fills it (envd/internal/filesystem/entry.go) and the
//! file metadata kept in xattrs (envd/internal/metadata).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::connect::pj;
use crate::error::Error;

/// FileType is the proto enum, written as its name.
#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum FileType {
    #[default]
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

fn is_unspecified(t: &FileType) -> bool {
    *t == FileType::Unspecified
}

#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "is_unspecified")]
    pub r#type: FileType,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(with = "pj::i64s", skip_serializing_if = "pj::is_zero")]
    pub size: i64,
    #[serde(skip_serializing_if = "pj::is_zero")]
    pub mode: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub permissions: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub owner: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    pub modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Names caches uid and gid lookups for one request (a large ListDir
/// would otherwise read /etc/passwd once per entry).
#[derive(Default)]
pub struct Names {
    users: Option<HashMap<u32, String>>,
    groups: Option<HashMap<u32, String>>,
}

fn id_names(file: &str) -> HashMap<u32, String> {
    let mut m = HashMap::new();
    for l in std::fs::read_to_string(file).unwrap_or_default().lines() {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 3 || f[0].is_empty() {
            continue;
        }
        if let Ok(id) = f[2].parse::<u32>() {
            m.entry(id).or_insert_with(|| f[0].to_string());
        }
    }
    m
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        let m = self.users.get_or_insert_with(|| id_names("/etc/passwd"));
        m.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    fn group(&mut self, gid: u32) -> String {
        let m = self.groups.get_or_insert_with(|| id_names("/etc/group"));
        m.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }

    /// entry describes path without following a final symlink (see
    /// entry_info). Errors are lstat's.
    pub fn entry(&mut self, path: &Path) -> Result<EntryInfo, Error> {
        let md = std::fs::symlink_metadata(path).map_err(|e| Error::io(format!("lstat {}", path.display()), e))?;
        let mode = md.mode();
        let mut e = EntryInfo {
            name: valid_utf8(base_name(path)),
            r#type: file_type(&md.file_type()),
            path: valid_utf8(path.as_os_str().as_bytes()),
            size: md.size() as i64,
            mode: mode & 0o777,
            permissions: mode_string(mode),
            owner: self.user(md.uid()),
            group: self.group(md.gid()),
            modified_time: timestamp(md.mtime(), md.mtime_nsec() as u32),
            symlink_target: None,
            metadata: BTreeMap::new(),
        };
        if md.file_type().is_symlink() {
            let (target, resolved) = resolve_link(path);
            match resolved {
                Some(t) => {
                    e.r#type = file_type(&t.file_type());
                    e.mode = t.permissions().mode() & 0o777;
                }
                None => {
                    e.r#type = FileType::Symlink;
                    e.mode = 0;
                }
            }
            e.symlink_target = Some(valid_utf8(target.as_os_str().as_bytes()));
        }
        // Best effort, as in E2B: an entry whose xattrs cannot be read is
        // still worth returning.
        if let Ok(m) = crate::xattr::read_user(path) {
            e.metadata = m
                .into_iter()
                .filter_map(|(k, v)| Some((String::from_utf8(k).ok()?, String::from_utf8(v).ok()?)))
                .collect();
        }
        Ok(e)
    }
}

/// entry_info describes the entry at path the way E2B's envd does: a
/// symlink that resolves reports its target's type and permission bits and
/// the resolved target; a dangling one is FILE_TYPE_SYMLINK with its
/// literal target made absolute.
pub fn entry_info(path: &Path) -> Result<EntryInfo, Error> {
    Names::default().entry(path)
}

fn base_name(p: &Path) -> &[u8] {
    match p.file_name() {
        Some(n) => n.as_bytes(),
        None => b"/",
    }
}

/// resolve_link is where the symlink at path finally points and what is
/// there; for a link that does not resolve, its literal target made
/// absolute against the link's directory, and None.
fn resolve_link(path: &Path) -> (PathBuf, Option<std::fs::Metadata>) {
    if let Ok(r) = std::fs::canonicalize(path) {
        if let Ok(md) = std::fs::metadata(&r) {
            return (r, Some(md));
        }
    }
    match std::fs::read_link(path) {
        Ok(t) => {
            let t = if t.is_absolute() {
                t
            } else {
                path.parent().unwrap_or(Path::new("/")).join(t)
            };
            (crate::user::clean(&t), None)
        }
        Err(_) => (path.to_path_buf(), None),
    }
}

pub fn file_type(t: &std::fs::FileType) -> FileType {
    if t.is_file() {
        FileType::File
    } else if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        // Devices, FIFOs and sockets: E2B reports them unspecified too.
        FileType::Unspecified
    }
}

/// mode_string is Go's fs.FileMode.String of a stat(2) mode:
/// "-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx", "dtrwxrwxrwx", "Dcrw-rw-rw-".
pub fn mode_string(mode: u32) -> String {
    let fmt = mode & libc::S_IFMT;
    let mut s = String::new();
    // Go's order: d a l T L D p S u g c t ?
    if fmt == libc::S_IFDIR {
        s.push('d');
    }
    if fmt == libc::S_IFLNK {
        s.push('L');
    }
    if fmt == libc::S_IFBLK || fmt == libc::S_IFCHR {
        s.push('D');
    }
    if fmt == libc::S_IFIFO {
        s.push('p');
    }
    if fmt == libc::S_IFSOCK {
        s.push('S');
    }
    if mode & libc::S_ISUID != 0 {
        s.push('u');
    }
    if mode & libc::S_ISGID != 0 {
        s.push('g');
    }
    if fmt == libc::S_IFCHR {
        s.push('c');
    }
    if mode & libc::S_ISVTX != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// timestamp is protojson's Timestamp: RFC 3339 in UTC with 0, 3, 6 or 9
/// fractional digits.
pub fn timestamp(secs: i64, nanos: u32) -> String {
    let base = crate::log::rfc3339(secs, 0);
    let base = base.trim_end_matches('Z');
    let frac = if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    };
    format!("{base}{frac}Z")
}

/// valid_utf8 makes a file name safe for a proto string: each run of
/// invalid bytes becomes one U+FFFD, as Go's strings.ToValidUTF8.
pub fn valid_utf8(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut in_run = false;
    for chunk in b.utf8_chunks() {
        if !chunk.valid().is_empty() {
            in_run = false;
        }
        out.push_str(chunk.valid());
        if !chunk.invalid().is_empty() && !in_run {
            out.push('\u{FFFD}');
            in_run = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings() {
        assert_eq!(mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(mode_string(libc::S_IFDIR | 0o1777), "dtrwxrwxrwx");
        assert_eq!(mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(mode_string(libc::S_IFREG | 0o4755), "urwxr-xr-x");
        assert_eq!(mode_string(libc::S_IFIFO | 0o600), "prw-------");
    }

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(0, 5_000_000), "1970-01-01T00:00:00.005Z");
        assert_eq!(timestamp(0, 5_000), "1970-01-01T00:00:00.000005Z");
        assert_eq!(timestamp(0, 123_456_789), "1970-01-01T00:00:00.123456789Z");
    }

    #[test]
    fn utf8() {
        assert_eq!(valid_utf8(b"abc"), "abc");
        assert_eq!(valid_utf8(b"a\xff\xfeb"), "a\u{FFFD}b");
        assert_eq!(valid_utf8(b"\xffa\xff"), "\u{FFFD}a\u{FFFD}");
    }

    #[test]
    fn entries() {
        let d = std::env::temp_dir().join(format!("envd-rs-entry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("f"), "hello").unwrap();
        std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("sub", d.join("l")).unwrap();
        std::os::unix::fs::symlink("nowhere", d.join("dangling")).unwrap();
        let f = entry_info(&d.join("f")).unwrap();
        assert_eq!(
            (f.name.as_str(), f.r#type, f.size, f.mode),
            ("f", FileType::File, 5, 0o640)
        );
        assert_eq!(f.permissions, "-rw-r-----");
        let l = entry_info(&d.join("l")).unwrap();
        assert_eq!(l.r#type, FileType::Directory);
        assert_eq!(l.symlink_target.as_deref(), Some(d.join("sub").to_str().unwrap()));
        assert!(l.permissions.starts_with('L'));
        let g = entry_info(&d.join("dangling")).unwrap();
        assert_eq!((g.r#type, g.mode), (FileType::Symlink, 0));
        assert_eq!(g.symlink_target.as_deref(), Some(d.join("nowhere").to_str().unwrap()));
        let e = entry_info(&d.join("missing")).unwrap_err();
        assert_eq!(e.code, crate::error::Code::NotFound);
        assert!(e.message.starts_with("lstat "), "{}", e.message);
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "5");
        assert!(v.get("symlinkTarget").is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
