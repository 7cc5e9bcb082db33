//! What both Rust agents (agent.rs, hyper/) do before their first answer,
//! besides listening: envd's PID 1 set-up and its check of the default user.

use std::ffi::{c_int, c_ulong, c_void};
use std::os::fd::AsRawFd;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _pad: [u8; 22],
}

extern "C" {
    fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int;
}

const SIOCGIFFLAGS: c_ulong = 0x8913;
const SIOCSIFFLAGS: c_ulong = 0x8914;
const IFF_UP: i16 = 1;

/// loopback_up is envd's loopback.Up: a new network namespace's lo is down.
pub fn loopback_up() {
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

/// check_user is envd's check of its default user: a scan of /etc/passwd,
/// which says when the user is missing (envd then runs commands as root).
pub fn check_user(name: &str) {
    let known = std::fs::read_to_string("/etc/passwd")
        .map(|p| p.lines().any(|l| l.split(':').next() == Some(name)))
        .unwrap_or(false);
    if !known {
        eprintln!("agentfloor: user {name} missing, using root");
    }
}
