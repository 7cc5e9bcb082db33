//! What commands leave running (envd/internal/process/sweep.go): a command
//! told to stop ends with its whole session (and cgroup); one whose leader
//! exited on its own keeps what it started in the background, remembered
//! so that a runaway (a fork bomb's survivors) can be ended, and so that a
//! start that finds the sandbox out of pids can sweep them all.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cgroup::Cgroup;

const MAX_LEFTOVERS: usize = 1024;
/// More processes than this left by one command is a runaway.
pub const RUNAWAY_MEMBERS: usize = 256;
const WATCH_SAMPLES: usize = 10;
const WATCH_INTERVAL: Duration = Duration::from_millis(100);
const SWEEP_PASSES: usize = 200;

/// Leftover is what a command left: its session, and its cgroup.
#[derive(Clone)]
pub struct Leftover {
    pub sid: i32,
    pub cg: Option<Arc<Cgroup>>,
}

impl Leftover {
    /// end kills everything the command left: its cgroup whole, then what
    /// of its session is outside it.
    pub fn end(&self) {
        if let Some(cg) = &self.cg {
            cg.kill();
        }
        end_session(self.sid);
    }

    fn gone(&self) {
        if let Some(cg) = &self.cg {
            cg.retire();
        }
    }

    fn populated(&self) -> bool {
        self.cg.as_ref().is_some_and(|c| c.populated())
    }
}

#[derive(Default)]
pub struct Sessions {
    entries: Mutex<Vec<Leftover>>,
}

impl Sessions {
    /// add watches what a command left for a second, then remembers it; a
    /// runaway is ended instead. Blocking: run it off the runtime.
    pub fn add(&self, e: Leftover) {
        let mut seen = HashSet::new();
        for i in 0..WATCH_SAMPLES {
            let (live, zombies) = session_members(e.sid);
            if live.is_empty() && !e.populated() {
                e.gone();
                return;
            }
            let n = live.len();
            seen.extend(live);
            if seen.len() > RUNAWAY_MEMBERS || n + zombies > RUNAWAY_MEMBERS {
                e.end();
                return;
            }
            if i < WATCH_SAMPLES - 1 {
                std::thread::sleep(WATCH_INTERVAL);
            }
        }
        self.remember(e);
    }

    /// remember keeps e for later checks and sweeps (the oldest of a full
    /// list is forgotten).
    pub fn remember(&self, e: Leftover) {
        let mut g = self.entries.lock().unwrap();
        if g.len() == MAX_LEFTOVERS {
            g.remove(0).gone();
        }
        g.push(e);
    }

    /// check ends remembered leftovers that became runaways and forgets
    /// those that are gone; a start calls it.
    pub fn check(&self) {
        let mut g = self.entries.lock().unwrap();
        if g.is_empty() {
            return;
        }
        let sizes = session_sizes();
        g.retain(|e| {
            let (live, zombies) = sizes.get(&e.sid).copied().unwrap_or((0, 0));
            if live == 0 && !e.populated() {
                e.gone();
                return false;
            }
            if live + zombies > RUNAWAY_MEMBERS {
                e.end();
                return false;
            }
            true
        });
    }

    /// forget drops sid: its number now belongs to a new command.
    pub fn forget(&self, sid: i32) {
        self.entries.lock().unwrap().retain(|e| {
            if e.sid != sid {
                return true;
            }
            e.gone();
            false
        });
    }

    /// sweep ends every remembered leftover; it returns how many still had
    /// processes.
    pub fn sweep(&self) -> usize {
        let entries = std::mem::take(&mut *self.entries.lock().unwrap());
        let mut ended = 0;
        for e in entries {
            if !session_members(e.sid).0.is_empty() || e.populated() {
                e.end();
                ended += 1;
            } else {
                e.gone();
            }
        }
        ended
    }
}

/// end_session SIGKILLs every process left in session sid (stopped first,
/// so a bomb cannot refill what the kills free), until none is left.
pub fn end_session(sid: i32) {
    for _ in 0..SWEEP_PASSES {
        let (pids, _) = session_members(sid);
        if pids.is_empty() {
            return;
        }
        for &pid in &pids {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        for &pid in &pids {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// session_members lists the live processes of session sid, and counts its
/// zombies.
pub fn session_members(sid: i32) -> (Vec<i32>, usize) {
    let mut live = Vec::new();
    let mut zombies = 0;
    scan_proc(|pid, session, zombie| {
        if session == sid {
            if zombie {
                zombies += 1;
            } else {
                live.push(pid);
            }
        }
    });
    (live, zombies)
}

fn session_sizes() -> HashMap<i32, (usize, usize)> {
    let mut m: HashMap<i32, (usize, usize)> = HashMap::new();
    scan_proc(|_, session, zombie| {
        let n = m.entry(session).or_default();
        if zombie {
            n.1 += 1;
        } else {
            n.0 += 1;
        }
    });
    m
}

fn scan_proc(mut f: impl FnMut(i32, i32, bool)) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for ent in dir.flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(b) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((session, zombie)) = parse_stat(&b) {
            f(pid, session, zombie);
        }
    }
}

/// parse_stat reads the session and zombie state from /proc/PID/stat.
fn parse_stat(b: &[u8]) -> Option<(i32, bool)> {
    let i = b.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(&b[i + 1..]).ok()?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    if f.len() <= 3 {
        return None;
    }
    Some((f[3].parse().ok()?, f[0] == "Z"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        assert_eq!(parse_stat(b"12 (a) b) c) S 1 12 12 0 -1"), Some((12, false)));
        assert_eq!(parse_stat(b"13 (sh) Z 1 13 9 0"), Some((9, true)));
        assert_eq!(parse_stat(b"13 (sh) Z 1"), None);
    }

    #[test]
    fn own_session_is_seen() {
        // SAFETY: getsid(0) is always safe.
        let sid = unsafe { libc::getsid(0) };
        let me = std::process::id() as i32;
        assert!(session_members(sid).0.contains(&me));
    }
}
