//! agent.rs: bench/agentfloor/agent.c in Rust, with the standard library
//! alone (and libc's ioctl, poll and waitpid, which it does not wrap; the
//! set-up it shares with hyper/ is in start.rs). It asks
//! whether a Rust agent keeps the C floor: one thread, no runtime, a static
//! binary. Build: rustc --edition 2021 -O -C target-feature=+crt-static
//! -C strip=symbols -o envd agent.rs

use std::ffi::{c_int, c_ulong};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::exit;

mod start;

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

extern "C" {
    fn poll(fds: *mut PollFd, n: c_ulong, timeout: c_int) -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
}

const POLLIN: i16 = 1;
const WNOHANG: c_int = 1;

/// answer reads one request (headers, then Content-Length bytes of body)
/// and answers 204, closing the connection as sandboxd's probe asks.
fn answer(c: &mut impl ReadWrite) {
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 4096];
    let end = loop {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 8192 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let want: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut have = buf.len() - end;
    while have < want {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => have += n,
        }
    }
    let _ = c.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
}

trait ReadWrite: Read + Write {}
impl ReadWrite for UnixStream {}
impl ReadWrite for TcpStream {}

fn listen_unix(path: &str) -> std::io::Result<UnixListener> {
    let tmp = format!("{path}.{}.tmp", std::process::id());
    let _ = fs::remove_file(&tmp);
    let l = UnixListener::bind(&tmp)?;
    fs::rename(&tmp, path)?;
    Ok(l)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mut sock, mut addr, mut user, mut init) = (None, None, "user".to_string(), false);
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--version" => {
                println!("agentfloor-rs");
                return;
            }
            "--init" => init = true,
            "--socket" if i + 1 < args.len() => {
                i += 1;
                sock = Some(args[i].clone())
            }
            "--listen" if i + 1 < args.len() => {
                i += 1;
                addr = Some(args[i].clone())
            }
            "--default-user" if i + 1 < args.len() => {
                i += 1;
                user = args[i].clone()
            }
            _ => {}
        }
        i += 1;
    }
    if init {
        start::loopback_up();
    }
    start::check_user(&user);
    let unix = sock.map(|p| {
        listen_unix(&p).unwrap_or_else(|e| {
            eprintln!("{p}: {e}");
            exit(1)
        })
    });
    let tcp = addr.filter(|a| !a.is_empty()).map(|a| {
        TcpListener::bind(&a).unwrap_or_else(|e| {
            eprintln!("{a}: {e}");
            exit(1)
        })
    });
    let mut fds: Vec<PollFd> = Vec::new();
    if let Some(l) = &unix {
        fds.push(PollFd {
            fd: l.as_raw_fd(),
            events: POLLIN,
            revents: 0,
        });
    }
    if let Some(l) = &tcp {
        fds.push(PollFd {
            fd: l.as_raw_fd(),
            events: POLLIN,
            revents: 0,
        });
    }
    if fds.is_empty() {
        eprintln!("agentfloor: nothing to serve on: set --listen or --socket");
        exit(2);
    }
    loop {
        // SAFETY: fds is a live array of pollfd of the length given.
        let n = unsafe {
            poll(
                fds.as_mut_ptr(),
                fds.len() as c_ulong,
                if init { 1000 } else { -1 },
            )
        };
        if n > 0 {
            for f in &fds {
                if f.revents & POLLIN == 0 {
                    continue;
                }
                if unix.as_ref().is_some_and(|l| l.as_raw_fd() == f.fd) {
                    if let Ok((mut c, _)) = unix.as_ref().unwrap().accept() {
                        answer(&mut c);
                    }
                } else if let Some(Ok((mut c, _))) = tcp.as_ref().map(|l| l.accept()) {
                    answer(&mut c);
                }
            }
        }
        // SAFETY: waitpid with WNOHANG and a null status only reaps.
        while init && unsafe { waitpid(-1, std::ptr::null_mut(), WNOHANG) } > 0 {}
    }
}
