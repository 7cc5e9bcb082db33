//! GET /metrics (envd/metrics.go): memory and CPU of the sandbox's own
//! cgroup (v2, or v1's memory and cpuacct controllers), so a sandbox
//! reports its limits rather than the host's, and the usage of the disk
//! at cfg.disk_path. The reading is file work, done off the event loop.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Serialize, Serializer};

use crate::http::{self, Request, Response};
use crate::state::State;
use crate::user;

/// The cgroup envd moves into below the sandbox's tree (envd/internal/cgroup).
const ENVD_LEAF: &str = "envd";

/// Sampler turns cumulative CPU time into a utilisation between calls.
#[derive(Default)]
pub struct Sampler {
    last: tokio::sync::Mutex<Option<(Instant, u64)>>,
}

#[derive(Serialize, Debug, Default)]
struct Metrics {
    ts: i64,
    cpu_count: u64,
    #[serde(serialize_with = "go_float")]
    cpu_used_pct: f64,
    mem_total: u64,
    mem_used: u64,
    mem_cache: u64,
    mem_total_mib: u64,
    mem_used_mib: u64,
    disk_used: u64,
    disk_total: u64,
}

/// go_float writes a float as Go's encoding/json does: integral values
/// without a fraction.
fn go_float<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f64(*v)
    }
}

pub async fn handle(st: Arc<State>, _req: Request) -> Response {
    let disk = st.cfg.disk_path.clone();
    let collected = user::blocking(move || Ok(collect(&disk))).await;
    let (mut m, cg) = match collected {
        Ok(v) => v,
        Err(e) => return http::error_json(500, &e.message),
    };
    m.cpu_used_pct = percent(&st.metrics, cg, m.cpu_count).await;
    http::json(200, &m)
}

fn collect(disk: &str) -> (Metrics, Cgroup) {
    let cg = own_cgroup();
    let mut m = Metrics {
        ts: crate::state::now_unix(),
        cpu_count: cg.cpu_count(),
        ..Default::default()
    };
    (m.mem_total, m.mem_used, m.mem_cache) = cg.memory();
    (m.mem_total_mib, m.mem_used_mib) = (m.mem_total >> 20, m.mem_used >> 20);
    if let Ok(c) = std::ffi::CString::new(disk) {
        // SAFETY: statfs fills the zeroed struct; c is NUL-terminated.
        let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut sf) } == 0 {
            let bs = sf.f_bsize as u64;
            m.disk_total = sf.f_blocks as u64 * bs;
            m.disk_used = (sf.f_blocks as u64).saturating_sub(sf.f_bfree as u64) * bs;
        }
    }
    (m, cg)
}

/// percent is CPU use since the previous call, or over 100 ms on the
/// first, as a percentage of the sandbox's CPUs.
async fn percent(s: &Sampler, cg: Cgroup, cpus: u64) -> f64 {
    let mut last = s.last.lock().await;
    let cg = Arc::new(cg);
    let usec = |cg: &Arc<Cgroup>| {
        let cg = cg.clone();
        async move { user::blocking(move || Ok(cg.cpu_usec())).await.unwrap_or(0) }
    };
    let (mut now, mut u) = (Instant::now(), usec(&cg).await);
    let (last_at, last_usec) = match *last {
        Some(v) => v,
        None => {
            let first = (now, u);
            tokio::time::sleep(Duration::from_millis(100)).await;
            (now, u) = (Instant::now(), usec(&cg).await);
            first
        }
    };
    *last = Some((now, u));
    let elapsed = now.duration_since(last_at).as_micros() as u64;
    let delta = u.wrapping_sub(last_usec);
    if elapsed == 0 || u < delta || cpus == 0 {
        return 0.0;
    }
    let pct = delta as f64 / elapsed as f64 / cpus as f64 * 100.0;
    (pct.min(100.0) * 100.0).round() / 100.0
}

/// Cgroup is envd's own cgroup directory: v2, or v1's controllers.
#[derive(Default, Debug, PartialEq)]
struct Cgroup {
    v2: String,
    mem_v1: String,
    cpu_v1: String,
}

fn own_cgroup() -> Cgroup {
    parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(), |p| {
        Path::new(p).exists()
    })
}

fn join(root: &str, p: &str) -> String {
    crate::user::clean(Path::new(&format!("{root}/{p}")))
        .display()
        .to_string()
}

fn parse_proc_cgroup(data: &str, exists: impl Fn(&str) -> bool) -> Cgroup {
    let mut cg = Cgroup::default();
    for line in data.lines() {
        let parts: Vec<&str> = line.splitn(3, ':').collect();
        if parts.len() != 3 {
            continue;
        }
        let (ctrls, path) = (parts[1], parts[2]);
        if parts[0] == "0" && ctrls.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                if exists(&join(root, &format!("{path}/cgroup.controllers"))) {
                    cg.v2 = join(root, path);
                    if path == format!("/{ENVD_LEAF}") {
                        // envd's own leaf of the sandbox's tree: the sandbox is its parent.
                        cg.v2 = root.to_string();
                    }
                    break;
                }
            }
        } else if ctrls.split(',').any(|c| c == "memory") {
            cg.mem_v1 = join("/sys/fs/cgroup/memory", path);
        } else if ctrls.split(',').any(|c| c == "cpuacct") {
            cg.cpu_v1 = join(&format!("/sys/fs/cgroup/{ctrls}"), path);
        }
    }
    cg
}

fn read_string(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn read_uint(p: &str) -> u64 {
    read_string(p).parse().unwrap_or(0)
}

fn stat_field(p: &str, key: &str) -> u64 {
    stat_field_of(&read_string(p), key)
}

fn stat_field_of(data: &str, key: &str) -> u64 {
    for line in data.lines() {
        if let Some((k, v)) = line.split_once(' ') {
            if k == key {
                return v.trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

fn exists(p: &str) -> bool {
    Path::new(p).exists()
}

fn num_cpu() -> u64 {
    // SAFETY: the set is zeroed and of the size passed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let n = libc::CPU_COUNT(&set);
            if n > 0 {
                return n as u64;
            }
        }
        let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN);
        if n > 0 {
            n as u64
        } else {
            1
        }
    }
}

/// quota_cpus is ceil(quota/period) when both are positive.
fn quota_cpus(q: &str, p: &str) -> Option<u64> {
    let q: f64 = q.parse().ok()?;
    let p: f64 = p.parse().ok()?;
    (q > 0.0 && p > 0.0).then(|| (q / p).ceil() as u64)
}

impl Cgroup {
    /// memory is total (the cgroup's limit, capped at physical memory),
    /// used (without page cache) and cache, in bytes.
    fn memory(&self) -> (u64, u64, u64) {
        // SAFETY: sysinfo fills the zeroed struct.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        let have_info = unsafe { libc::sysinfo(&mut info) } == 0;
        let unit = info.mem_unit as u64;
        let mut total = if have_info { info.totalram as u64 * unit } else { 0 };
        let (usage, cache);
        if !self.mem_v1.is_empty() && exists(&format!("{}/memory.usage_in_bytes", self.mem_v1)) {
            usage = read_uint(&format!("{}/memory.usage_in_bytes", self.mem_v1));
            let lim = read_uint(&format!("{}/memory.limit_in_bytes", self.mem_v1));
            if lim > 0 && lim < total {
                total = lim;
            }
            cache = stat_field(&format!("{}/memory.stat", self.mem_v1), "total_cache");
        } else if !self.v2.is_empty() && exists(&format!("{}/memory.current", self.v2)) {
            usage = read_uint(&format!("{}/memory.current", self.v2));
            let lim = read_uint(&format!("{}/memory.max", self.v2));
            if lim > 0 && lim < total {
                total = lim;
            }
            cache = stat_field(&format!("{}/memory.stat", self.v2), "file");
        } else {
            let free = (info.freeram as u64 + info.bufferram as u64) * unit;
            return (total, total - total.min(free), info.bufferram as u64 * unit);
        }
        (total, usage - usage.min(cache), cache)
    }

    /// cpu_count is the cgroup's CPU quota rounded up, else the CPUs envd
    /// may run on.
    fn cpu_count(&self) -> u64 {
        let mut n = num_cpu();
        if !self.v2.is_empty() {
            let s = read_string(&format!("{}/cpu.max", self.v2));
            let f: Vec<&str> = s.split_whitespace().collect();
            if f.len() == 2 && f[0] != "max" {
                if let Some(q) = quota_cpus(f[0], f[1]) {
                    n = n.min(q);
                }
            }
        }
        if !self.cpu_v1.is_empty() {
            let dir = self.cpu_v1.replacen("cpuacct", "cpu", 1);
            let q = read_string(&format!("{dir}/cpu.cfs_quota_us"));
            let p = read_string(&format!("{dir}/cpu.cfs_period_us"));
            if let Some(c) = quota_cpus(&q, &p) {
                n = n.min(c);
            }
        }
        n.max(1)
    }

    /// cpu_usec is the cumulative CPU time of the cgroup (or the machine).
    fn cpu_usec(&self) -> u64 {
        if !self.cpu_v1.is_empty() && exists(&format!("{}/cpuacct.usage", self.cpu_v1)) {
            return read_uint(&format!("{}/cpuacct.usage", self.cpu_v1)) / 1000;
        }
        if !self.v2.is_empty() && exists(&format!("{}/cpu.stat", self.v2)) {
            return stat_field(&format!("{}/cpu.stat", self.v2), "usage_usec");
        }
        proc_stat_usec(&read_string("/proc/stat"))
    }
}

/// proc_stat_usec: user+nice+system+irq+softirq+steal ticks of all CPUs.
fn proc_stat_usec(stat: &str) -> u64 {
    let first = stat.lines().next().unwrap_or("");
    let mut ticks = 0u64;
    for (i, v) in first.split_whitespace().enumerate() {
        if i == 0 || i == 4 || i == 5 || i > 8 {
            continue;
        }
        ticks += v.parse::<u64>().unwrap_or(0);
    }
    ticks * 10_000 // USER_HZ is 100 on Linux
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroup() {
        let v2 = parse_proc_cgroup("0::/envd\n", |p| p == "/sys/fs/cgroup/envd/cgroup.controllers");
        assert_eq!(v2.v2, "/sys/fs/cgroup");
        let v2 = parse_proc_cgroup("0::/user.slice/x\n", |p| p.starts_with("/sys/fs/cgroup/unified/"));
        assert_eq!(v2.v2, "/sys/fs/cgroup/unified/user.slice/x");
        let v1 = parse_proc_cgroup("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n", |_| false);
        assert_eq!(
            v1,
            Cgroup {
                v2: String::new(),
                mem_v1: "/sys/fs/cgroup/memory/docker/abc".into(),
                cpu_v1: "/sys/fs/cgroup/cpu,cpuacct/docker/abc".into()
            }
        );
    }

    #[test]
    fn fields() {
        assert_eq!(stat_field_of("usage_usec 1234\nuser_usec 1000\n", "usage_usec"), 1234);
        assert_eq!(stat_field_of("anon 1\nfile 99\n", "file"), 99);
        assert_eq!(stat_field_of("anon 1\n", "file"), 0);
        assert_eq!(
            proc_stat_usec("cpu  10 20 30 400 500 6 7 8 9 10\ncpu0 1\n"),
            (10 + 20 + 30 + 6 + 7 + 8) * 10_000
        );
        assert_eq!(quota_cpus("150000", "100000"), Some(2));
        assert_eq!(quota_cpus("max", "100000"), None);
    }

    #[test]
    fn json_shape() {
        let m = Metrics {
            cpu_used_pct: 0.0,
            ..Default::default()
        };
        let s = serde_json::to_string(&m).unwrap();
        assert!(s.contains("\"cpu_used_pct\":0,"), "{s}");
        let m = Metrics {
            cpu_used_pct: 12.34,
            ..Default::default()
        };
        assert!(serde_json::to_string(&m).unwrap().contains("\"cpu_used_pct\":12.34"));
    }
}
