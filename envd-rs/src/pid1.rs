//! PID 1's duties beyond reaping (which is the reaper's): a container
//! without a NIC starts with loopback down, and commands and the port
//! tunnel need it up.

use std::io;

/// become_init brings `lo` up.
pub fn become_init() -> io::Result<()> {
    // SAFETY: a plain socket for the ioctls below, closed at the end.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; the name fits; the ioctls read and
    // write only it.
    let r = unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        ifr.ifr_name[..2].copy_from_slice(&[b'l' as libc::c_char, b'o' as libc::c_char]);
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut ifr);
        if r == 0 && ifr.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &ifr);
        }
        r
    };
    let err = io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if r != 0 {
        return Err(err);
    }
    Ok(())
}
