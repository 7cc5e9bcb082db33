//! agent.rs: bench/agentfloor/agent.c in Rust, with the standard library
//! alone (and libc's ioctl and poll, which it does not wrap). It asks
//! whether a Rust agent keeps the C floor: one thread, no runtime, a static
//! binary. Build: rustc --edition 2021 -O -C target-feature=+crt-static
//! -C strip=symbols -o envd agent.rs

use std::ffi::{c_int, c_ulong, c_void};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::exit;

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _pad: [u8; 22],
}

extern "C" {
    fn poll(fds: *mut PollFd, n: c_ulong, timeout: c_int) -> c_int;
    fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
}

const POLLIN: i16 = 1;
const SIOCGIFFLAGS: c_ulong = 0x8913;
const SIOCSIFFLAGS: c_ulong = 0x8914;
const IFF_UP: i16 = 1;
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

/// loopback_up is envd's loopback.Up: a new network namespace's lo is down.
fn loopback_up() {
    let s = match std::net::UdpSocket::bind("0.0.0.0:0") {
        Ok(s) => s,
        Err(e) => return eprintln!("lo: {e}"),
    };
    let mut ifr = IfReq {
        name: [0; 16],
        flags: 0,
        _pad: [0; 22],
    };
    ifr.name[..2].copy_from_slice(b"lo");
    // SAFETY: ifr is a struct ifreq the size the kernel reads and writes.
    let flags = |req, ifr: &mut IfReq| unsafe {
        ioctl(s.as_raw_fd(), req, ifr as *mut IfReq as *mut c_void)
    };
    if flags(SIOCGIFFLAGS, &mut ifr) == 0 {
        ifr.flags |= IFF_UP;
        if flags(SIOCSIFFLAGS, &mut ifr) != 0 {
            eprintln!("lo up: {}", std::io::Error::last_os_error());
        }
    }
}

/// lookup_user is envd's check of its default user: a scan of /etc/passwd.
fn lookup_user(name: &str) -> bool {
    fs::read_to_string("/etc/passwd")
        .map(|p| p.lines().any(|l| l.split(':').next() == Some(name)))
        .unwrap_or(false)
}

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
        loopback_up();
    }
    if !lookup_user(&user) {
        eprintln!("agentfloor: user {user} missing, using root");
    }
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
