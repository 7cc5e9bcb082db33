//! envd's log: JSON lines on stderr in log/slog's shape, and a ring of the
//! records at info and above that `GET /logs` serves (sandboxd copies them
//! into the sandbox's log). Never log an env var's value, a token or a
//! file's contents.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
    fn upper(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
    fn lower(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

const RING_RECORDS: usize = 1000;
const RING_BYTES: usize = 256 << 10;
const MAX_VALUE: usize = 4 << 10;

#[derive(Serialize, Clone)]
pub struct Record {
    pub seq: u64,
    pub time: String,
    pub level: &'static str,
    pub msg: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
}

#[derive(Serialize)]
pub struct LogsResponse {
    pub boot: String,
    pub last: u64,
    pub records: Vec<Record>,
}

struct Ring {
    recs: VecDeque<(Record, usize)>,
    size: usize,
    seq: u64,
}

pub struct Logger {
    level: Level,
    boot: String,
    ring: Mutex<Ring>,
}

impl Logger {
    pub fn new(level: Level) -> Logger {
        let mut b = [0u8; 8];
        // SAFETY: getrandom writes at most b.len() bytes into b.
        unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        Logger {
            level,
            boot: b.iter().map(|x| format!("{x:02x}")).collect(),
            ring: Mutex::new(Ring {
                recs: VecDeque::new(),
                size: 0,
                seq: 0,
            }),
        }
    }

    pub fn enabled(&self, level: Level) -> bool {
        level >= self.level || level >= Level::Info
    }

    /// log writes a record; fields are key/value pairs of strings.
    pub fn log(&self, level: Level, msg: &str, fields: &[(&str, String)]) {
        let now = rfc3339_now();
        if level >= self.level {
            let mut line = serde_json::Map::new();
            line.insert("time".into(), now.clone().into());
            line.insert("level".into(), level.upper().into());
            line.insert("msg".into(), msg.into());
            for (k, v) in fields {
                line.insert((*k).into(), v.clone().into());
            }
            let mut out = serde_json::to_vec(&line).unwrap_or_default();
            out.push(b'\n');
            let _ = std::io::stderr().lock().write_all(&out);
        }
        if level < Level::Info {
            return;
        }
        let fields: BTreeMap<String, String> = fields.iter().map(|(k, v)| ((*k).to_string(), cut(v))).collect();
        let msg = cut(msg);
        let size = msg.len() + 48 + fields.iter().map(|(k, v)| k.len() + v.len() + 8).sum::<usize>();
        let mut r = self.ring.lock().unwrap();
        r.seq += 1;
        let rec = Record {
            seq: r.seq,
            time: now,
            level: level.lower(),
            msg,
            fields,
        };
        r.recs.push_back((rec, size));
        r.size += size;
        while r.recs.len() > 1 && (r.recs.len() > RING_RECORDS || r.size > RING_BYTES) {
            let (_, n) = r.recs.pop_front().unwrap();
            r.size -= n;
        }
    }

    /// after answers GET /logs: the records after seq of this boot, or all
    /// held when boot is not this run's or seq is beyond the newest.
    pub fn after(&self, boot: &str, seq: u64) -> LogsResponse {
        let r = self.ring.lock().unwrap();
        let mut from = 0;
        if boot == self.boot && seq <= r.seq {
            if let Some((first, _)) = r.recs.front() {
                if seq >= first.seq {
                    from = (seq - first.seq + 1) as usize;
                }
            }
        }
        LogsResponse {
            boot: self.boot.clone(),
            last: r.seq,
            records: r.recs.iter().skip(from).map(|(rec, _)| rec.clone()).collect(),
        }
    }
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_VALUE {
        return s.to_string();
    }
    let mut end = MAX_VALUE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// rfc3339_now formats the wall clock as RFC 3339 with nanoseconds, UTC.
pub fn rfc3339_now() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_nanos())
}

/// rfc3339 formats seconds since the epoch (UTC) as RFC 3339.
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_string()
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// civil_from_days is (year, month, day) of a day since the epoch: Howard
/// Hinnant's days-to-civil algorithm.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Log a record: `log!(logger, Info, "msg", "key" => value, ...)`; values
/// are anything that implements ToString.
#[macro_export]
macro_rules! log {
    ($l:expr, $lvl:ident, $msg:expr $(, $k:expr => $v:expr)* $(,)?) => {{
        let lg: &$crate::log::Logger = &$l;
        if lg.enabled($crate::log::Level::$lvl) {
            lg.log($crate::log::Level::$lvl, $msg, &[$(($k, ($v).to_string())),*]);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400, 5_000_000), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_083_200, 0), "2026-12-01T00:00:00Z");
    }

    #[test]
    fn ring_keeps_the_newest_and_answers_after() {
        let l = Logger::new(Level::Error);
        for i in 0..1005 {
            l.log(Level::Info, "m", &[("i", i.to_string())]);
        }
        l.log(Level::Debug, "never kept", &[]);
        let all = l.after("other boot", 0);
        assert_eq!(all.last, 1005);
        assert_eq!(all.records.len(), 1000);
        assert_eq!(all.records[0].seq, 6);
        let boot = all.boot.clone();
        let tail = l.after(&boot, 1003);
        assert_eq!(tail.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1004, 1005]);
        assert!(l.after(&boot, 1005).records.is_empty());
        assert_eq!(l.after(&boot, 9999).records.len(), 1000);
    }
}
