//! The one place that waits for child processes. As the sandbox's PID 1,
//! envd inherits every orphan, and a `waitpid(-1)` would take the exit
//! status a command's own wait is owed; so all waiting happens here: each
//! SIGCHLD reaps whatever has exited, hands the status of a registered
//! child to its waiter and drops an orphan's.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use tokio::sync::oneshot;

#[derive(Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<i32>>>,
}

impl Reaper {
    /// spawn runs start, which forks a child and returns its pid, and
    /// registers the child before any reap can see it exit. The receiver
    /// gets its wait status (as waitpid's).
    pub fn spawn<F>(&self, start: F) -> io::Result<(i32, oneshot::Receiver<i32>)>
    where
        F: FnOnce() -> io::Result<i32>,
    {
        let mut w = self.waiters.lock().unwrap();
        let pid = start()?;
        let (tx, rx) = oneshot::channel();
        w.insert(pid, tx);
        Ok((pid, rx))
    }

    /// reap collects every child that has exited.
    pub fn reap(&self) {
        let mut w = self.waiters.lock().unwrap();
        loop {
            let mut status = 0;
            // SAFETY: status is a valid out-pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if let Some(tx) = w.remove(&pid) {
                let _ = tx.send(status);
            }
        }
    }

    /// run reaps at every SIGCHLD, for as long as envd runs.
    pub async fn run(&self) {
        let Ok(mut sig) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) else {
            return;
        };
        self.reap();
        while sig.recv().await.is_some() {
            self.reap();
        }
    }
}

/// ExitInfo is a wait status in the terms of envd's process end event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, or -1 when a signal ended the process.
    pub code: i32,
    /// Whether the process exited (rather than was killed by a signal).
    pub exited: bool,
    /// Go's os.ProcessState.String(): "exit status 1", "signal: killed".
    pub status: String,
}

impl ExitInfo {
    pub fn from_wait_status(ws: i32) -> ExitInfo {
        if libc::WIFEXITED(ws) {
            let c = libc::WEXITSTATUS(ws);
            return ExitInfo {
                code: c,
                exited: true,
                status: format!("exit status {c}"),
            };
        }
        if libc::WIFSIGNALED(ws) {
            let sig = libc::WTERMSIG(ws);
            let mut status = format!("signal: {}", signal_name(sig));
            if libc::WCOREDUMP(ws) {
                status.push_str(" (core dumped)");
            }
            return ExitInfo {
                code: -1,
                exited: false,
                status,
            };
        }
        ExitInfo {
            code: -1,
            exited: false,
            status: format!("wait status {ws}"),
        }
    }
}

/// signal_name is Go's name of a signal (syscall.Signal.String()).
pub fn signal_name(sig: i32) -> String {
    let s = match sig {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGILL => "illegal instruction",
        libc::SIGTRAP => "trace/breakpoint trap",
        libc::SIGABRT => "aborted",
        libc::SIGBUS => "bus error",
        libc::SIGFPE => "floating point exception",
        libc::SIGKILL => "killed",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGUSR2 => "user defined signal 2",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        libc::SIGCHLD => "child exited",
        libc::SIGCONT => "continued",
        libc::SIGSTOP => "stopped (signal)",
        libc::SIGTSTP => "stopped",
        libc::SIGTTIN => "stopped (tty input)",
        libc::SIGTTOU => "stopped (tty output)",
        libc::SIGXCPU => "CPU time limit exceeded",
        libc::SIGXFSZ => "file size limit exceeded",
        libc::SIGSYS => "bad system call",
        _ => return format!("signal {sig}"),
    };
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses() {
        assert_eq!(
            ExitInfo::from_wait_status(3 << 8),
            ExitInfo {
                code: 3,
                exited: true,
                status: "exit status 3".into()
            }
        );
        assert_eq!(
            ExitInfo::from_wait_status(libc::SIGKILL),
            ExitInfo {
                code: -1,
                exited: false,
                status: "signal: killed".into()
            }
        );
        assert_eq!(ExitInfo::from_wait_status(libc::SIGTERM).status, "signal: terminated");
    }
}
