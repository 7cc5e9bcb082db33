//! envd's state: its configuration, the execution defaults that /init sets,
//! the access token, and the services' own state.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hyper::http::request::Parts;

use crate::error::{Code, Error};
use crate::log::Logger;
use crate::reaper::Reaper;
use crate::user::{self, User};
use crate::{filesystem, metrics, process};

pub struct Config {
    /// User for requests that name none, until /init sets defaultUser.
    pub default_user: String,
    /// Default working directory; empty = the user's home.
    pub workdir: String,
    /// The filesystem whose usage /metrics reports.
    pub disk_path: String,
    /// The sandbox's delegated cgroup2 tree, where each command gets a
    /// cgroup of its own; None = commands share envd's cgroup.
    pub cgroup_root: Option<String>,
    /// Pids no single command may take from the sandbox's limit.
    pub pids_reserve: u64,
}

#[derive(Default, Clone)]
pub struct Defaults {
    pub envs: BTreeMap<String, String>,
    pub user: String,
    pub workdir: String,
}

pub struct State {
    pub log: Logger,
    pub cfg: Config,
    pub reaper: Reaper,
    defaults: Mutex<Defaults>,
    token: Mutex<String>,
    pub process: process::Service,
    pub filesystem: filesystem::Service,
    pub metrics: metrics::Sampler,
}

impl State {
    pub fn new(log: Logger, cfg: Config) -> Arc<State> {
        let defaults = Defaults {
            envs: BTreeMap::new(),
            user: cfg.default_user.clone(),
            workdir: cfg.workdir.clone(),
        };
        Arc::new(State {
            log,
            cfg,
            reaper: Reaper::default(),
            defaults: Mutex::new(defaults),
            token: Mutex::new(String::new()),
            process: process::Service::default(),
            filesystem: filesystem::Service::default(),
            metrics: metrics::Sampler::default(),
        })
    }

    /// defaults is a copy of the execution defaults.
    pub fn defaults(&self) -> Defaults {
        self.defaults.lock().unwrap().clone()
    }

    /// merge_defaults applies an /init: env vars merged, a non-empty user
    /// or workdir replaces the current one.
    pub fn merge_defaults(&self, envs: &BTreeMap<String, String>, user: &str, workdir: &str) {
        let mut d = self.defaults.lock().unwrap();
        for (k, v) in envs {
            d.envs.insert(k.clone(), v.clone());
        }
        if !user.is_empty() {
            d.user = user.to_string();
        }
        if !workdir.is_empty() {
            d.workdir = workdir.to_string();
        }
    }

    /// user_named is the user a request names, or the default user.
    pub fn user_named(&self, name: Option<&str>) -> Result<Arc<User>, Error> {
        let name = match name {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => self.defaults().user,
        };
        user::lookup(&name).map(Arc::new)
    }

    /// rpc_user is the user of an RPC: its Basic auth, else the default.
    pub fn rpc_user(&self, parts: &Parts) -> Result<Arc<User>, Error> {
        let h = parts
            .headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let name = user::basic_auth_user(h)?;
        self.user_named(name.as_deref())
    }

    pub fn set_token(&self, t: &str) {
        *self.token.lock().unwrap() = t.to_string();
    }

    pub fn token_is_set(&self) -> bool {
        !self.token.lock().unwrap().is_empty()
    }

    /// token_equal compares v with the token in constant time; an unset
    /// token matches nothing.
    pub fn token_equal(&self, v: &str) -> bool {
        let t = self.token.lock().unwrap();
        !t.is_empty() && constant_time_eq(t.as_bytes(), v.as_bytes())
    }

    /// verify_signature checks a /files URL signature (envdapi.VerifySignature).
    pub fn verify_signature(
        &self,
        signature: &str,
        path: &str,
        op: &str,
        user: &str,
        expiration: &str,
    ) -> Result<(), Error> {
        let token = self.token.lock().unwrap().clone();
        verify_signature(signature, path, op, user, &token, expiration, now_unix())
    }
}

/// for_test is envd's state as root without a cgroup tree, for unit tests.
#[cfg(test)]
pub fn for_test() -> Arc<State> {
    let cfg = Config {
        default_user: "root".into(),
        workdir: String::new(),
        disk_path: "/".into(),
        cgroup_root: None,
        pids_reserve: 64,
    };
    State::new(Logger::new(crate::log::Level::Error), cfg)
}

pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// sign is envdapi.Sign: "v1_" + base64(sha256(path:op:user:token[:exp])).
pub fn sign(path: &str, op: &str, user: &str, token: &str, expiration: i64) -> String {
    use base64::Engine;
    use sha2::Digest;
    let mut s = format!("{path}:{op}:{user}:{token}");
    if expiration != 0 {
        s.push_str(&format!(":{expiration}"));
    }
    let sum = sha2::Sha256::digest(s.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(sum))
}

pub fn verify_signature(
    signature: &str,
    path: &str,
    op: &str,
    user: &str,
    token: &str,
    expiration: &str,
    now: i64,
) -> Result<(), Error> {
    if signature.is_empty() {
        return Err(Error::new(Code::Unauthenticated, "missing signature query parameter"));
    }
    let bad = || Error::new(Code::Unauthenticated, "invalid signature");
    if token.is_empty() {
        return Err(bad());
    }
    let mut exp = 0i64;
    if !expiration.is_empty() {
        exp = expiration.parse().map_err(|_| bad())?;
        if exp <= 0 {
            return Err(bad());
        }
    }
    if !constant_time_eq(sign(path, op, user, token, exp).as_bytes(), signature.as_bytes()) {
        return Err(bad());
    }
    if exp != 0 && now > exp {
        return Err(Error::new(Code::Unauthenticated, "signature is already expired"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        let s = sign("/home/user/a", "read", "user", "tok", 0);
        assert!(s.starts_with("v1_"));
        assert!(verify_signature(&s, "/home/user/a", "read", "user", "tok", "", 100).is_ok());
        assert!(verify_signature(&s, "/home/user/a", "write", "user", "tok", "", 100).is_err());
        assert!(verify_signature(&s, "/home/user/a", "read", "user", "", "", 100).is_err());
        assert!(verify_signature("", "/home/user/a", "read", "user", "tok", "", 100).is_err());
        let e = sign("/p", "write", "", "tok", 50);
        assert!(verify_signature(&e, "/p", "write", "", "tok", "50", 50).is_ok());
        assert_eq!(
            verify_signature(&e, "/p", "write", "", "tok", "50", 51)
                .unwrap_err()
                .message,
            "signature is already expired"
        );
        assert!(verify_signature(&e, "/p", "write", "", "tok", "-1", 0).is_err());
    }

    #[test]
    fn constant_time() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
