//! What the benchmarks measure with: a process's memory and CPU time from `/proc`, plain HTTP/1.1
//! on loopback (the operator's `/metrics`, the agent's fault endpoint), the API server's audit log
//! counted by user agent, and quantiles of samples and of Prometheus histograms.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A `kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn proc_status(pid: u32, key: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// User plus system CPU time of a process, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name start at field 3 (state); utime and stime are
    // fields 14 and 15.
    let rest = text.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).context("no utime")?.parse::<u64>()?
        + fields.get(12).context("no stime")?.parse::<u64>()?;
    Ok(Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second() as f64))
}

/// The whole machine's CPU time from `/proc/stat`, summed over its CPUs: busy is everything but
/// idle and iowait.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MachineCpu {
    pub busy: Duration,
    pub total: Duration,
    pub cpus: u32,
}

impl MachineCpu {
    /// The machine's CPU time now.
    pub fn now() -> anyhow::Result<Self> {
        parse_proc_stat(&std::fs::read_to_string("/proc/stat")?, clock_ticks_per_second())
    }

    /// What was spent between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(earlier.busy),
            total: self.total.saturating_sub(earlier.total),
            cpus: self.cpus,
        }
    }
}

/// The `cpu` line of `/proc/stat` (user nice system idle iowait irq softirq steal; guest time is
/// already in user), and the number of `cpuN` lines.
fn parse_proc_stat(text: &str, hz: u64) -> anyhow::Result<MachineCpu> {
    let all = text.lines().find(|l| l.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
    let ticks: Vec<u64> = all.split_whitespace().skip(1).take(8).map(str::parse).collect::<Result<_, _>>()?;
    anyhow::ensure!(ticks.len() >= 5, "short cpu line in /proc/stat: {all}");
    let total: u64 = ticks.iter().sum();
    let busy = total - ticks[3] - ticks[4];
    let cpus = text.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count();
    let secs = |t: u64| Duration::from_secs_f64(t as f64 / hz as f64);
    Ok(MachineCpu { busy: secs(busy), total: secs(total), cpus: cpus as u32 })
}

/// The CPU time of every live process whose command name (`/proc/<pid>/comm`, 15 bytes at most) is
/// one of `names`, by pid.
pub fn processes_cpu(names: &[&str]) -> BTreeMap<u32, (String, Duration)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return BTreeMap::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let comm = comm.trim_end();
            let name = names.iter().find(|n| comm == &n[..n.len().min(15)])?;
            // A process that exits between the two reads is left out, as one that exited before.
            Some((pid, (name.to_string(), cpu_time(pid).ok()?)))
        })
        .collect()
}

/// The CPU time each name's processes spent between two [`processes_cpu`] readings. A process
/// that started in between counts whole; one that ended in between is not seen.
pub fn cpu_by_name(
    before: &BTreeMap<u32, (String, Duration)>,
    after: &BTreeMap<u32, (String, Duration)>,
) -> BTreeMap<String, Duration> {
    let mut out: BTreeMap<String, Duration> = BTreeMap::new();
    for (pid, (name, t)) in after {
        let earlier = before.get(pid).filter(|(n, _)| n == name).map_or(Duration::ZERO, |(_, t)| *t);
        *out.entry(name.clone()).or_default() += t.saturating_sub(earlier);
    }
    out
}

/// `CLK_TCK`, the unit of the stat times (100 on every Linux this runs on; asked anyway).
/// Asked once a process: every CPU reading of a window (the machine's and each process's) needs it.
fn clock_ticks_per_second() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(100)
    })
}

/// One HTTP/1.1 request over plain TCP (`Connection: close`); returns the status code and body.
/// A GET that fails (a reset connection) is tried twice more. Every transport failure (refused,
/// reset, an answer that is not HTTP) is a [`std::io::Error`], which [`crate::wait::until`]
/// retries as transient.
pub async fn http(
    method: &str,
    url: &str,
    json_body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, String)> {
    let tries = if method == "GET" { 3 } else { 1 };
    let mut attempt = 1;
    loop {
        match http_once(method, url, json_body).await {
            Err(e) if attempt < tries => {
                tracing::debug!(%url, error = %e, "HTTP request failed; retrying");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

async fn http_once(
    method: &str,
    url: &str,
    json_body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, String)> {
    let rest = url.strip_prefix("http://").context("the URL must be http://")?;
    let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
    let body = json_body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let content_type = if json_body.is_some() { "Content-Type: application/json\r\n" } else { "" };
    let head = format!(
        "{method} /{path} HTTP/1.1\r\nHost: {addr}\r\n{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    // A server that closes the connection before answering (one shutting down) is a transport
    // failure like a reset: an io::Error.
    let code = code.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an HTTP response: {text:?}"))
    })?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((code, body))
}

/// The audit log and the files the API server rotated it into (`audit-<time>.log` beside it),
/// oldest first. Fails when they no longer reach back to `from`: a count from them would be short.
fn audit_files(log: &std::path::Path, from: &str) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use std::io::BufRead as _;
    let dir = log.parent().context("the audit log has no directory")?;
    let stem = log.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
        })
        .collect();
    files.sort();
    files.push(log.to_path_buf());
    let first = std::fs::File::open(&files[0]).with_context(|| format!("opening {}", files[0].display()))?;
    let oldest = std::io::BufReader::new(first)
        .lines()
        .next()
        .transpose()?
        .and_then(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .and_then(|e| e["requestReceivedTimestamp"].as_str().map(str::to_owned))
        .unwrap_or_default();
    anyhow::ensure!(
        oldest.as_str() <= from,
        "the audit log starts at {oldest}, after the window's start {from}: it was rotated away (raise --audit-log-maxbackup)"
    );
    Ok(files)
}

/// Audit events from one user agent between two instants (RFC 3339 strings compare in order),
/// counted by verb and resource (`patch nodes`, `create pods/eviction`), from the log and its
/// rotated files.
pub fn requests_by(
    log: &std::path::Path,
    agent_prefix: &str,
    from: &str,
    to: &str,
) -> anyhow::Result<BTreeMap<String, u64>> {
    count_audit(log, agent_prefix, from, to, |e| {
        e["userAgent"].as_str().unwrap_or_default().starts_with(agent_prefix).then(|| request_kind(e))
    })
}

/// The users whose pod writes bound a wide migration's time: the DaemonSet controller (device
/// plugin pods deleted, driver pods created), the ReplicaSet controller (evicted pods replaced) and
/// the scheduler (bindings). The cluster's audit policy logs these writes of theirs, and nothing
/// else of the control plane's (`e2e/hack/cluster-up.sh`).
pub const CONTROL_PLANE_WRITERS: [(&str, &str); 3] = [
    ("system:serviceaccount:kube-system:daemon-set-controller", "daemon-set-controller"),
    ("system:serviceaccount:kube-system:replicaset-controller", "replicaset-controller"),
    ("system:kube-scheduler", "kube-scheduler"),
];

/// The pod writes of [`CONTROL_PLANE_WRITERS`] between `from` and `to`, counted by writer, verb
/// and resource (`daemon-set-controller delete pods`), from the log and its rotated files.
pub fn control_plane_writes(
    log: &std::path::Path,
    from: &str,
    to: &str,
) -> anyhow::Result<BTreeMap<String, u64>> {
    count_audit(log, r#""username":"system:"#, from, to, |e| {
        let user = e["user"]["username"].as_str()?;
        let (_, short) = CONTROL_PLANE_WRITERS.iter().find(|(u, _)| *u == user)?;
        Some(format!("{short} {}", request_kind(e)))
    })
}

/// `verb resource[/subresource]` of one audit event.
fn request_kind(e: &serde_json::Value) -> String {
    let resource = e["objectRef"]["resource"].as_str().unwrap_or("?");
    let sub = e["objectRef"]["subresource"].as_str().map(|s| format!("/{s}")).unwrap_or_default();
    format!("{} {resource}{sub}", e["verb"].as_str().unwrap_or("?"))
}

/// Audit events between two instants whose line contains `needle` (a cheap filter before
/// parsing), counted under the key `key` gives them (`None`: not counted).
///
/// The API server may rotate the log while it is read: it renames the current file and starts a
/// new one, and a count that listed the files before that reads the new, nearly empty file in
/// place of the renamed one. So a count is kept only if the files and the current file's inode
/// are the same after it as before; otherwise it is made again. Between the rename and the new
/// file there is no current file: a count that finds none, or cannot open a file it listed, is
/// made again too.
fn count_audit(
    log: &std::path::Path,
    needle: &str,
    from: &str,
    to: &str,
    key: impl Fn(&serde_json::Value) -> Option<String>,
) -> anyhow::Result<BTreeMap<String, u64>> {
    const ATTEMPTS: usize = 3;
    let inode = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).map(|m| m.ino()).ok()
    };
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let (files, current) = (audit_files(log, from)?, inode(log));
        let counts = count_files(&files, needle, from, to, &key);
        if current.is_some() && audit_files(log, from)? == files && inode(log) == current {
            return counts;
        }
    }
    anyhow::bail!("the audit log {} was rotated during each of {ATTEMPTS} counts", log.display())
}

/// [`count_audit`] over a fixed list of files.
fn count_files(
    files: &[std::path::PathBuf],
    needle: &str,
    from: &str,
    to: &str,
    key: &impl Fn(&serde_json::Value) -> Option<String>,
) -> anyhow::Result<BTreeMap<String, u64>> {
    use std::io::BufRead as _;
    let mut counts = BTreeMap::new();
    for path in files {
        let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            if !line.contains(needle) {
                continue;
            }
            let Ok(e) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            let at = e["requestReceivedTimestamp"].as_str().unwrap_or_default();
            if at < from || at > to {
                continue;
            }
            if let Some(k) = key(&e) {
                *counts.entry(k).or_default() += 1;
            }
        }
    }
    Ok(counts)
}

/// One request as RBAC sees it: API group ("" for core), resource (with `/subresource`), verb.
pub type RbacRequest = (String, String, String);

/// What `user` asked of the API between `from` and `to` (audit-log timestamps), with the
/// response codes each got. Non-resource requests (discovery, `/version`) are left out: RBAC's
/// `system:discovery` grants those to every user.
pub fn requests_of_user(
    log: &std::path::Path,
    user: &str,
    from: &str,
    to: &str,
) -> anyhow::Result<BTreeMap<RbacRequest, BTreeSet<u16>>> {
    use std::io::BufRead as _;
    let needle = format!("\"{user}\"");
    let mut out: BTreeMap<RbacRequest, BTreeSet<u16>> = BTreeMap::new();
    let file = std::fs::File::open(log).with_context(|| format!("opening {}", log.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if !line.contains(&needle) {
            continue;
        }
        let Ok(e) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        let at = e["requestReceivedTimestamp"].as_str().unwrap_or_default();
        if e["user"]["username"].as_str() != Some(user) || at < from || at > to || e["objectRef"].is_null() {
            continue;
        }
        let group = e["objectRef"]["apiGroup"].as_str().unwrap_or_default().to_owned();
        let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
        let resource = match e["objectRef"]["subresource"].as_str() {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_owned(),
        };
        let verb = e["verb"].as_str().unwrap_or_default().to_owned();
        let code = e["responseStatus"]["code"].as_u64().unwrap_or_default() as u16;
        out.entry((group, resource, verb)).or_default().insert(code);
    }
    Ok(out)
}

/// Now, as the audit log writes its timestamps.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// The value of an unlabelled gauge or counter in Prometheus or OpenMetrics text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).find_map(|v| v.trim().parse().ok())
}

/// The value of the series of `name` whose labels include every pair of `labels`, in Prometheus
/// or OpenMetrics text (label values without quotes or commas, as the operator's are).
pub fn labelled(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let prefix = format!("{name}{{");
    text.lines().find_map(|l| {
        let (set, value) = l.strip_prefix(&prefix)?.split_once("} ")?;
        let pairs: Vec<&str> = set.split(',').collect();
        labels
            .iter()
            .all(|(k, v)| pairs.contains(&format!("{k}=\"{v}\"").as_str()))
            .then(|| value.trim().parse().ok())?
    })
}

/// The cumulative buckets `(le, count)` of a histogram in Prometheus or OpenMetrics text, and its
/// total count. `name` is the metric name without `_bucket`.
pub fn histogram(text: &str, name: &str) -> (Vec<(f64, f64)>, f64) {
    let prefix = format!("{name}_bucket{{");
    let mut buckets = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else { continue };
        let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
        let Some(count) = line.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok()) else { continue };
        buckets.push((le, count));
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    (buckets, total)
}

/// The `q` quantile of a histogram's observations between two scrapes (`before` may be empty),
/// interpolated linearly inside its bucket as Prometheus's `histogram_quantile` does. `None`
/// without observations; the upper bound of the last finite bucket when it falls in `+Inf`.
pub fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let at = |le: f64| before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1);
    let delta: Vec<(f64, f64)> = after.iter().map(|&(le, c)| (le, c - at(le))).collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in &delta {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let within = if width > 0.0 { (rank - lower.1) / width } else { 1.0 };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `wait::until` retries: a refused connection and a server that closes without
    /// answering both fail as an io::Error.
    #[tokio::test]
    async fn http_transport_failures_are_io_errors() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let refused = http("GET", &format!("http://{closed}/metrics"), None).await.unwrap_err();
        assert!(refused.downcast_ref::<std::io::Error>().is_some(), "{refused:#}");

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // Each of the GET's three tries: read the request, close without a word.
            for _ in 0..3 {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
            }
        });
        let silent = http("GET", &format!("http://{addr}/metrics"), None).await.unwrap_err();
        server.await.unwrap();
        let io = silent.downcast_ref::<std::io::Error>();
        assert_eq!(io.map(std::io::Error::kind), Some(std::io::ErrorKind::InvalidData), "{silent:#}");
        assert!(silent.to_string().starts_with("not an HTTP response"), "{silent:#}");

        let not_http = http("GET", "https://127.0.0.1:1/", None).await.unwrap_err();
        assert!(not_http.downcast_ref::<std::io::Error>().is_none(), "a wrong URL is not transient");
    }

    #[test]
    fn a_labelled_series_is_found_by_a_subset_of_its_labels() {
        let text = "switchyard_pool_gpus{migration=\"a\",backend=\"dra\"} 12\nswitchyard_pool_gpus{migration=\"ab\",backend=\"dra\"} 4\n";
        assert_eq!(
            labelled(text, "switchyard_pool_gpus", &[("migration", "ab"), ("backend", "dra")]),
            Some(4.0)
        );
        assert_eq!(labelled(text, "switchyard_pool_gpus", &[("backend", "dra")]), Some(12.0));
        assert_eq!(labelled(text, "switchyard_pool_gpus", &[("backend", "none")]), None);
        assert_eq!(labelled(text, "switchyard_pool", &[]), None, "another metric's prefix");
    }

    #[test]
    fn the_machines_cpu_time_is_read_from_the_cpu_line() {
        let stat = "cpu  100 5 50 800 20 3 2 0 40 0\ncpu0 50 2 25 400 10 1 1 0 20 0\ncpu1 50 3 25 400 10 2 1 0 20 0\nintr 1 2 3\nctxt 9\n";
        let m = parse_proc_stat(stat, 100).unwrap();
        // Guest time (40) is inside user already; idle and iowait are not busy.
        assert_eq!(m.total, Duration::from_secs_f64(9.80));
        assert_eq!(m.busy, Duration::from_secs_f64(1.60));
        assert_eq!(m.cpus, 2);
        let later = MachineCpu { busy: Duration::from_secs(3), total: Duration::from_secs(12), cpus: 2 };
        assert_eq!(later.since(&m).busy, Duration::from_secs_f64(1.40));
        assert!(parse_proc_stat("intr 1\n", 100).is_err());
    }

    #[test]
    fn the_live_machine_and_this_process_have_cpu_time() {
        let m = MachineCpu::now().unwrap();
        assert!(m.cpus >= 1 && m.busy <= m.total && m.total > Duration::ZERO, "{m:?}");
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let me = std::process::id();
        // Burn a little CPU so that the second reading is later than the first.
        let before = processes_cpu(&[comm.trim_end()]);
        assert!(before.contains_key(&me), "{before:?}");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = processes_cpu(&[comm.trim_end()]);
        let spent = cpu_by_name(&before, &after);
        assert!(spent[comm.trim_end()] > Duration::ZERO, "{spent:?}");
    }

    #[test]
    fn a_process_started_in_the_window_counts_whole_and_a_reused_pid_is_not_subtracted() {
        let s = |n: &str, ms: u64| (n.to_string(), Duration::from_millis(ms));
        let before = BTreeMap::from([(1, s("etcd", 100)), (2, s("kubectl", 50))]);
        let after = BTreeMap::from([(1, s("etcd", 300)), (2, s("etcd", 70)), (3, s("kubectl", 40))]);
        let spent = cpu_by_name(&before, &after);
        assert_eq!(spent["etcd"], Duration::from_millis(270));
        assert_eq!(spent["kubectl"], Duration::from_millis(40));
    }

    const SCRAPE: &str = "# TYPE switchyard_reconcile_duration_seconds histogram
switchyard_reconcile_duration_seconds_sum 1.5
switchyard_reconcile_duration_seconds_count 10
switchyard_reconcile_duration_seconds_bucket{le=\"0.001\"} 0
switchyard_reconcile_duration_seconds_bucket{le=\"0.002\"} 4
switchyard_reconcile_duration_seconds_bucket{le=\"0.004\"} 8
switchyard_reconcile_duration_seconds_bucket{le=\"0.008\"} 9
switchyard_reconcile_duration_seconds_bucket{le=\"+Inf\"} 10
";

    #[test]
    fn histogram_quantiles_interpolate_inside_the_bucket() {
        let (buckets, total) = histogram(SCRAPE, "switchyard_reconcile_duration_seconds");
        assert_eq!(total, 10.0);
        assert_eq!(buckets.len(), 5);
        // Rank 5 of 10 falls in (0.002, 0.004], one quarter of the way through its 4 counts.
        let p50 = histogram_quantile(&[], &buckets, 0.5).unwrap();
        assert!((p50 - 0.0025).abs() < 1e-9, "{p50}");
        // Rank 9.9 falls in +Inf: the last finite bound is all a histogram can say.
        assert_eq!(histogram_quantile(&[], &buckets, 0.99), Some(0.008));
        // Between two scrapes only the new observations count; none means no quantile.
        assert_eq!(histogram_quantile(&buckets, &buckets, 0.5), None);
    }

    #[test]
    fn a_sample_is_read_by_its_exact_name() {
        let text = "# TYPE switchyard_heap_in_use_bytes gauge\nswitchyard_heap_in_use_bytes_extra 1\nswitchyard_heap_in_use_bytes 12345678\n";
        assert_eq!(sample(text, "switchyard_heap_in_use_bytes"), Some(12345678.0));
        assert_eq!(sample(text, "switchyard_heap"), None);
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect::<Vec<_>>();
        let s = ms(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(percentile(&s, 50.0), Duration::from_millis(5));
        assert_eq!(percentile(&s, 99.0), Duration::from_millis(10));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    fn audit_line(
        at: &str,
        user: &str,
        agent: &str,
        verb: &str,
        resource: &str,
        sub: Option<&str>,
    ) -> String {
        serde_json::json!({
            "kind": "Event", "stage": "ResponseComplete", "verb": verb,
            "user": {"username": user, "groups": ["system:authenticated"]},
            "userAgent": agent,
            "objectRef": {"resource": resource, "subresource": sub},
            "requestReceivedTimestamp": at,
        })
        .to_string()
    }

    #[test]
    fn audit_counts_take_the_window_from_every_file_by_writer() {
        let dir = std::env::temp_dir().join(format!("switchyard-audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ds = "system:serviceaccount:kube-system:daemon-set-controller";
        let op = "switchyard-operator/0.1.0";
        // The rotated file holds the window's start, the live log its end.
        let rotated = [
            audit_line("2026-12-03T07:00:00.000000Z", "admin", op, "patch", "nodes", None),
            audit_line("2026-12-03T07:00:01.000000Z", ds, "kcm", "delete", "pods", None),
            audit_line("2026-12-03T07:00:02.000000Z", "admin", op, "create", "pods", Some("eviction")),
        ];
        let live = [
            audit_line("2026-12-03T07:00:03.000000Z", ds, "kcm", "create", "pods", None),
            audit_line(
                "2026-12-03T07:00:03.500000Z",
                "system:kube-scheduler",
                "sched",
                "create",
                "pods",
                Some("binding"),
            ),
            audit_line(
                "2026-12-03T07:00:04.000000Z",
                "system:serviceaccount:kube-system:job-controller",
                "kcm",
                "create",
                "pods",
                None,
            ),
            audit_line("2026-12-03T07:00:09.000000Z", ds, "kcm", "create", "pods", None),
        ];
        std::fs::write(dir.join("audit-2026-12-03T07-00-02.000.log"), rotated.join("\n") + "\n").unwrap();
        std::fs::write(dir.join("audit.log"), live.join("\n") + "\n").unwrap();
        let log = dir.join("audit.log");
        let (from, to) = ("2026-12-03T07:00:00.500000Z", "2026-12-03T07:00:05.000000Z");
        let ops = requests_by(&log, "switchyard-operator/", from, to).unwrap();
        assert_eq!(ops, BTreeMap::from([("create pods/eviction".to_string(), 1)]));
        let cp = control_plane_writes(&log, from, to).unwrap();
        assert_eq!(
            cp,
            BTreeMap::from([
                ("daemon-set-controller create pods".to_string(), 1),
                ("daemon-set-controller delete pods".to_string(), 1),
                ("kube-scheduler create pods/binding".to_string(), 1),
            ])
        );
        // A window older than the oldest file is an error, not a smaller count.
        assert!(requests_by(&log, "switchyard-operator/", "2026-12-03T06:00:00Z", to).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_count_the_log_was_rotated_under_is_made_again() {
        let dir = std::env::temp_dir().join(format!("switchyard-audit-rotation-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        let op = "switchyard-operator/0.1.0";
        let line = |at: &str, verb: &str| audit_line(at, "admin", op, verb, "nodes", None);
        let before =
            [line("2026-12-03T07:00:00.000000Z", "patch"), line("2026-12-03T07:00:01.000000Z", "get")];
        std::fs::write(&log, before.join("\n") + "\n").unwrap();
        // The API server rotates the log while the first count reads it: the file is renamed and
        // a new one holds the next request.
        let rotated = std::cell::Cell::new(false);
        let key = |e: &serde_json::Value| {
            if !rotated.replace(true) {
                std::fs::rename(&log, dir.join("audit-2026-12-03T07-00-01.500.log")).unwrap();
                std::fs::write(&log, line("2026-12-03T07:00:02.000000Z", "list") + "\n").unwrap();
            }
            Some(request_kind(e))
        };
        let (from, to) = ("2026-12-03T07:00:00.000000Z", "2026-12-03T07:00:05.000000Z");
        let counts = count_audit(&log, op, from, to, key).unwrap();
        // The first count read the renamed file to its end and missed the new one.
        let want = ["get nodes", "list nodes", "patch nodes"].map(|k| (k.to_string(), 1));
        assert_eq!(counts, BTreeMap::from(want));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_count_made_between_the_rename_and_the_new_file_is_made_again() {
        let dir = std::env::temp_dir().join(format!("switchyard-audit-gap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        let op = "switchyard-operator/0.1.0";
        let line = |at: &str, verb: &str| audit_line(at, "admin", op, verb, "nodes", None);
        std::fs::write(&log, line("2026-12-03T07:00:00.000000Z", "patch") + "\n").unwrap();
        // The first count reads the file; the API server renames it meanwhile, and has not
        // started the new one when the count ends. The second count finds the new file.
        let calls = std::cell::Cell::new(0);
        let key = |e: &serde_json::Value| {
            match calls.replace(calls.get() + 1) {
                0 => std::fs::rename(&log, dir.join("audit-2026-12-03T07-00-00.500.log")).unwrap(),
                1 => std::fs::write(&log, line("2026-12-03T07:00:02.000000Z", "list") + "\n").unwrap(),
                _ => {}
            }
            Some(request_kind(e))
        };
        let (from, to) = ("2026-12-03T07:00:00.000000Z", "2026-12-03T07:00:05.000000Z");
        let counts = count_audit(&log, op, from, to, key).unwrap();
        let want = ["list nodes", "patch nodes"].map(|k| (k.to_string(), 1));
        assert_eq!(counts, BTreeMap::from(want));
        // No log at all is an error that names it.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        let err = count_audit(&log, op, from, to, |e| Some(request_kind(e))).unwrap_err();
        assert!(format!("{err:#}").contains("audit.log"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
