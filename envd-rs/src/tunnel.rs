//! The port tunnel: `CONNECT 127.0.0.1:<port>` turns the connection into a
//! byte pipe to a TCP port on the sandbox's loopback, so that sandboxd's
//! proxy reaches any port without a network path into the sandbox
//! (envd/internal/tunnel). Only loopback targets: envd is no
//! general-purpose proxy. Open tunnels need no tracking for the shutdown:
//! envd's exit closes them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::http::{self, Request, Response};
use crate::state::State;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    host: &'static str,
    port: u16,
}

impl Target {
    fn addrs(&self) -> Vec<SocketAddr> {
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.port);
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), self.port);
        match self.host {
            "localhost" => vec![v4, v6],
            "::1" => vec![v6],
            _ => vec![v4],
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug)]
pub enum TargetError {
    /// A well-formed target that is not loopback: 403.
    NotLoopback(String),
    /// A malformed one: 400.
    Bad(String),
}

const NOT_LOOPBACK: &str = "tunnel target must be a loopback address (127.0.0.1, ::1 or localhost)";

/// parse_target checks a CONNECT authority: localhost, 127.0.0.1 or ::1,
/// and a decimal port from 1 to 65535 without leading zeros.
pub fn parse_target(authority: &str) -> Result<Target, TargetError> {
    let bad = |why: &str| TargetError::Bad(format!("malformed tunnel target {authority:?}: {why}"));
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(|| bad("missing port in address"))?;
        (h, p)
    } else {
        let (h, p) = authority
            .rsplit_once(':')
            .ok_or_else(|| bad("missing port in address"))?;
        if h.contains(':') {
            return Err(bad("too many colons in address"));
        }
        (h, p)
    };
    let port = parse_port(port).ok_or_else(|| bad("port must be a decimal number from 1 to 65535"))?;
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(Target {
            host: "localhost",
            port,
        });
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) if a == Ipv4Addr::LOCALHOST => Ok(Target {
            host: "127.0.0.1",
            port,
        }),
        Ok(IpAddr::V6(a)) if a == Ipv6Addr::LOCALHOST => Ok(Target { host: "::1", port }),
        Ok(_) => Err(TargetError::NotLoopback(format!("{NOT_LOOPBACK}: {authority:?}"))),
        // A zoned address (fe80::1%eth0) is well formed, and not loopback.
        Err(_)
            if host
                .split_once('%')
                .is_some_and(|(a, z)| !z.is_empty() && a.parse::<Ipv6Addr>().is_ok()) =>
        {
            Err(TargetError::NotLoopback(format!("{NOT_LOOPBACK}: {authority:?}")))
        }
        Err(_) if host.is_empty() || host.contains(['%', '[', ']', '/', ' ', '\t']) => Err(bad("bad host")),
        Err(_) => Err(TargetError::NotLoopback(format!("{NOT_LOOPBACK}: {authority:?}"))),
    }
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || s.starts_with('0') || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().filter(|n| *n <= 65535).map(|n| n as u16)
}

pub async fn handle(st: Arc<State>, req: Request) -> Response {
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    let target = match parse_target(&authority) {
        Ok(t) => t,
        Err(e) => {
            let (status, msg) = match e {
                TargetError::NotLoopback(m) => (403, m),
                TargetError::Bad(m) => (400, m),
            };
            log!(st.log, Debug, "tunnel refused", "target" => authority, "err" => msg);
            return http::error_json(status, &msg);
        }
    };
    let upstream = match dial(&target).await {
        Ok(c) => c,
        Err(e) => {
            log!(st.log, Debug, "tunnel target unreachable", "target" => target, "err" => e);
            let mut msg = format!("{target}: port is not open");
            if e.raw_os_error() != Some(libc::ECONNREFUSED) {
                msg.push_str(&format!(" ({e})"));
            }
            return http::error_json(502, &msg);
        }
    };
    let _ = upstream.set_nodelay(true);
    // The answer goes out first; then the connection (HTTP/1.1) or the
    // stream (h2) is handed over, with any bytes the client sent early.
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let client = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                log!(st.log, Debug, "tunnel: the connection was not handed over", "target" => target, "err" => e);
                return;
            }
        };
        log!(st.log, Debug, "tunnel open", "target" => target);
        let mut client = TokioIo::new(client);
        let mut upstream = upstream;
        let (up, down) = match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok(n) => n,
            Err(_) => (0, 0),
        };
        log!(st.log, Debug, "tunnel closed", "target" => target, "bytes_up" => up, "bytes_down" => down);
    });
    http::status(200)
}

async fn dial(t: &Target) -> std::io::Result<TcpStream> {
    let mut first = None;
    for a in t.addrs() {
        match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(c)) => return Ok(c),
            Ok(Err(e)) => first = first.or(Some(e)),
            Err(_) => first = first.or(Some(std::io::Error::from(std::io::ErrorKind::TimedOut))),
        }
    }
    Err(first.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::AddrNotAvailable)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let ok = [
            ("127.0.0.1:8080", "127.0.0.1", 8080),
            ("localhost:1", "localhost", 1),
            ("LOCALHOST:65535", "localhost", 65535),
            ("[::1]:443", "::1", 443),
        ];
        for (a, h, p) in ok {
            assert_eq!(parse_target(a).unwrap(), Target { host: h, port: p }, "{a}");
        }
        for a in [
            "10.0.0.1:80",
            "example.com:80",
            "[::2]:80",
            "169.254.1.1:22",
            "[fe80::1%eth0]:80",
        ] {
            assert!(matches!(parse_target(a), Err(TargetError::NotLoopback(_))), "{a}");
        }
        for a in [
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:080",
            "127.0.0.1:65536",
            "127.0.0.1:x",
            ":80",
            "[a%b]:80",
            "::1:80",
        ] {
            assert!(matches!(parse_target(a), Err(TargetError::Bad(_))), "{a}");
        }
        assert_eq!(Target { host: "::1", port: 8 }.to_string(), "[::1]:8");
    }
}
