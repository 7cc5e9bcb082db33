//! Each command in a cgroup of its own, inside the cgroup2 tree the backend
//! delegates to the sandbox (envd/internal/cgroup): envd moves into a leaf
//! of its own ("envd"), each command's cgroup gets a pids.max a reserve
//! below the sandbox's, and a command's end kills its cgroup whole.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const ENVD_LEAF: &str = "envd";
const ENVD_WEIGHT: &str = "10000";
const CGROUP2_SUPER_MAGIC: i64 = 0x63677270;
const REAP_INTERVAL: Duration = Duration::from_millis(500);

pub struct Tree {
    root: PathBuf,
    pids_max: Option<String>,
    seq: AtomicU64,
    retired: Mutex<(Vec<PathBuf>, bool)>,
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    let p = dir.join(file);
    std::fs::write(&p, value).map_err(|e| {
        format!(
            "cgroup {}: {}",
            p.display(),
            crate::error::Error::io("write", e).message
        )
    })
}

impl Tree {
    /// open organises the tree at root (Go's cgroup.Open); the error says
    /// why commands share envd's cgroup.
    pub fn open(root: &str, reserve: u64) -> Result<Tree, String> {
        let unsupported = "no delegated cgroup2 tree";
        let c = CString::new(root).map_err(|_| format!("{root}: {unsupported}"))?;
        // SAFETY: statfs fills st; c is NUL-terminated.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 || st.f_type as i64 != CGROUP2_SUPER_MAGIC {
            return Err(format!("{root}: {unsupported}"));
        }
        let root = PathBuf::from(root);
        let sc = CString::new(
            root.join("cgroup.subtree_control")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: sc is NUL-terminated.
        if unsafe { libc::access(sc.as_ptr(), libc::W_OK) } != 0 {
            return Err(format!("{}: not writable: {unsupported}", root.display()));
        }
        let leaf = root.join(ENVD_LEAF);
        if let Err(e) = std::fs::create_dir(&leaf) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(format!(
                    "cgroup {}: {}",
                    leaf.display(),
                    crate::error::Error::io("mkdir", e).message
                ));
            }
        }
        move_all(&root, &leaf)?;
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
        let mut pids_max = None;
        if has("pids") {
            write(&root, "cgroup.subtree_control", "+pids")?;
            pids_max = command_pids(&root, reserve);
        }
        if has("cpu") && write(&root, "cgroup.subtree_control", "+cpu").is_ok() {
            let _ = write(&leaf, "cpu.weight", ENVD_WEIGHT);
        }
        Ok(Tree {
            root,
            pids_max,
            seq: AtomicU64::new(0),
            retired: Mutex::new((Vec::new(), false)),
        })
    }

    /// new makes a cgroup for a command about to start.
    pub fn new_cgroup(self: &Arc<Tree>) -> Result<Cgroup, String> {
        let path = self
            .root
            .join(format!("cmd-{}", self.seq.fetch_add(1, Ordering::SeqCst) + 1));
        if let Err(e) = std::fs::create_dir(&path) {
            return Err(format!(
                "cgroup for a command: mkdir {}: {}",
                path.display(),
                crate::error::Error::io("", e).message.trim_start_matches(": ")
            ));
        }
        if let Some(m) = &self.pids_max {
            if let Err(e) = write(&path, "pids.max", m) {
                let _ = std::fs::remove_dir(&path);
                return Err(e);
            }
        }
        Ok(Cgroup {
            tree: self.clone(),
            path,
        })
    }

    fn retire(self: &Arc<Tree>, path: &Path) {
        match std::fs::remove_dir(path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => {}
        }
        let mut g = self.retired.lock().unwrap();
        g.0.push(path.to_path_buf());
        if !g.1 {
            let t = self.clone();
            // Without a thread (no pid to spare), the next retire tries again.
            g.1 = std::thread::Builder::new()
                .name("cgroup-reap".into())
                .spawn(move || t.reap())
                .is_ok();
        }
    }

    /// reap removes retired cgroups as they empty, while any is left.
    fn reap(&self) {
        loop {
            std::thread::sleep(REAP_INTERVAL);
            let mut g = self.retired.lock().unwrap();
            g.0.retain(|p| match std::fs::remove_dir(p) {
                Ok(()) => false,
                Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            });
            if g.0.is_empty() {
                g.1 = false;
                return;
            }
        }
    }
}

/// command_pids is a command's pids.max: the sandbox's limit less the
/// reserve (at most an eighth of it), None without a limit.
fn command_pids(root: &Path, reserve: u64) -> Option<String> {
    let limit: u64 = std::fs::read_to_string(root.join("pids.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(pids_for(limit, reserve))
}

fn pids_for(limit: u64, reserve: u64) -> String {
    let reserve = reserve.min(limit / 8);
    limit.saturating_sub(reserve).max(1).to_string()
}

fn move_all(from: &Path, to: &Path) -> Result<(), String> {
    for _ in 0..100 {
        let b = std::fs::read_to_string(from.join("cgroup.procs")).map_err(|e| {
            format!(
                "cgroup {}: {}",
                from.display(),
                crate::error::Error::io("read", e).message
            )
        })?;
        let pids: Vec<&str> = b.split_whitespace().collect();
        if pids.is_empty() {
            return Ok(());
        }
        for pid in pids {
            if let Err(e) = std::fs::write(to.join("cgroup.procs"), pid) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(format!("cgroup {}: {e}", to.display()));
                }
            }
        }
    }
    Err(format!("cgroup {}: processes keep appearing", from.display()))
}

/// Cgroup is one command's cgroup.
pub struct Cgroup {
    tree: Arc<Tree>,
    path: PathBuf,
}

impl Cgroup {
    /// procs_fd is the cgroup's cgroup.procs, open for the child to write
    /// "0" to (moving itself in) before its execve.
    pub fn procs_fd(&self) -> std::io::Result<OwnedFd> {
        let p = CString::new(self.path.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: p is NUL-terminated; the fd returned is ours.
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// discard removes a cgroup whose command did not start.
    pub fn discard(&self) {
        let _ = std::fs::remove_dir(&self.path);
    }

    /// populated says whether any process is left in the cgroup.
    pub fn populated(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.events"))
            .map(|s| s.contains("populated 1"))
            .unwrap_or(false)
    }

    /// kill SIGKILLs every process in the cgroup at once and retires it.
    pub fn kill(&self) {
        if write(&self.path, "cgroup.kill", "1").is_err() {
            self.kill_frozen();
        }
        self.retire();
    }

    fn kill_frozen(&self) {
        let _ = write(&self.path, "cgroup.freeze", "1");
        for _ in 0..100 {
            let b = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
            if b.trim().is_empty() {
                break;
            }
            for f in b.split_whitespace() {
                if let Ok(pid) = f.parse::<i32>() {
                    // SAFETY: plain kill(2).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = write(&self.path, "cgroup.freeze", "0");
    }

    /// retire removes the cgroup once it is empty.
    pub fn retire(&self) {
        self.tree.retire(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_pids_limits() {
        assert_eq!(pids_for(1000, 64), "936");
        assert_eq!(pids_for(100, 64), "88"); // at most an eighth
        assert_eq!(pids_for(1, 64), "1");
        assert_eq!(pids_for(0, 64), "1");
    }

    #[test]
    fn open_refuses_a_plain_directory() {
        assert!(Tree::open("/tmp", 64)
            .err()
            .unwrap()
            .contains("no delegated cgroup2 tree"));
    }
}
