//! `switchyard status <name>`: follows a GpuPoolMigration with a watch and shows where it stands,
//! as progress bars on a terminal or as one timestamped line per change in logs and pipes.
//!
//! [`snapshot`] boils the object down to what is shown and [`LineLog`] decides which lines a change
//! deserves; both are pure. The rest watches, ticks, draws and picks the exit code.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::pin::pin;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{EXIT_FINDINGS, StatusArgs, View};
use switchyard_operator::api::v1alpha1::{
    CordonHolder, Direction, GpuPoolMigration, NodeCounts, NodeState, Phase,
};
use switchyard_operator::node::record::state_str;
use switchyard_operator::report::conditions::{ConditionType, runbook};

/// Time in state is shown to the second; redrawing once a second keeps it counting up without
/// flicker, and a watch event redraws at once anyway.
const TICK: Duration = Duration::from_secs(1);

/// The fastest a burst of watch events redraws the bars: a pool of thousands of nodes can update
/// its status several times a second, and four frames a second are as many as anyone reads. The
/// last state of a burst is drawn by the next event or tick. The lines view prints every change,
/// as scripts read it.
const REDRAW_MIN: Duration = Duration::from_millis(250);

/// 128 + SIGINT: what shells report for a command stopped with Ctrl-C, so scripts can tell "the
/// user gave up watching" from "the migration failed".
const EXIT_INTERRUPTED: u8 = 130;

/// Width of the state column: the longest state name, `RollingBack`.
const STATE_WIDTH: usize = 11;

/// Everything `status` shows about a migration at one instant; built by [`snapshot`].
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The GpuPoolMigration's name.
    pub name: String,
    /// False until the operator has written a status.
    pub has_status: bool,
    /// `status.phase`.
    pub phase: Option<Phase>,
    /// `spec.direction`: which backend counts as "done".
    pub direction: Direction,
    /// `spec.paused`.
    pub paused: bool,
    /// The object is being deleted (the operator is cleaning up).
    pub deleting: bool,
    /// The status describes an older `metadata.generation` than the stored spec, so its phase
    /// may not hold for the spec any more (for example right after the direction was flipped).
    pub stale: bool,
    /// `status.nodes`.
    pub counts: NodeCounts,
    /// Nodes on the backend `spec.direction` asks for: `nodes.migrated` going forward; going back,
    /// the nodes counted neither migrated, in flight nor failed (the operator counts a node as
    /// migrated until it starts moving back).
    pub on_target: u64,
    /// Why the migration is not moving, when a condition says so.
    pub attention: Option<Attention>,
    /// One line per node in `status.inProgress`, in that order.
    pub nodes: Vec<NodeLine>,
    /// One line per node in `status.failed`.
    pub failed: Vec<FailedLine>,
    /// `lastTransitionTime` of `Reconciling` while it is True: when nodes began moving.
    pub moving_since: Option<Timestamp>,
    /// The `DevicePluginRemovable` message while it is True: the runbook's last step may run.
    pub device_plugin_removable: Option<String>,
    /// `status.pods`: the GPU pods on migrated nodes, checked.
    pub pods: Option<switchyard_api::v1alpha1::PodVerification>,
    /// `status.replace`: a Replace migration's target room and the old nodes left for removal.
    pub replace: Option<switchyard_api::v1alpha1::ReplaceStatus>,
}

/// A condition that explains why a migration does not move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attention {
    /// Whether a human is needed or the migration only waits.
    pub kind: AttentionKind,
    /// The condition's reason.
    pub reason: String,
    /// The condition's message, on one line.
    pub message: String,
}

/// How serious an [`Attention`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// `Stalled` is True: nothing moves until a human acts.
    Stalled,
    /// Neither `Reconciling` nor `Stalled` is True and the migration is not done: `Ready`'s
    /// reason says what it waits for (`spec.paused`, prerequisites, DeviceClasses).
    Waiting,
}

/// A node in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    /// Node name.
    pub name: String,
    /// The step it is in.
    pub state: NodeState,
    /// Seconds since it entered the step, when the operator recorded when that was.
    pub for_seconds: Option<u64>,
    /// What the step is doing or waiting for, on one line.
    pub message: String,
    /// The cordon is an admin's: the node stays cordoned once it has moved.
    pub admin_cordon: bool,
}

/// A node that failed to move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedLine {
    /// Node name.
    pub name: String,
    /// The step in which it failed.
    pub state: NodeState,
    /// The operator's CamelCase reason.
    pub reason: String,
    /// What went wrong, on one line.
    pub message: String,
}

/// What `status` shows of `gpm` at `now`.
pub fn snapshot(gpm: &GpuPoolMigration, now: Timestamp) -> Snapshot {
    let status = gpm.status.as_ref();
    let counts = status.map(|s| s.nodes).unwrap_or_default();
    let phase = status.and_then(|s| s.phase);
    let conditions: &[Condition] = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let find = |type_: ConditionType, value: &str| {
        conditions.iter().find(|c| c.type_ == type_.as_str() && c.status == value)
    };
    let reconciling = find(ConditionType::Reconciling, "True");
    let terminal = matches!(phase, Some(Phase::Completed | Phase::RolledBack | Phase::Failed));
    let attention = if let Some(c) = find(ConditionType::Stalled, "True") {
        Some(attention(AttentionKind::Stalled, c))
    } else if !terminal && reconciling.is_none() {
        find(ConditionType::Ready, "False").map(|c| attention(AttentionKind::Waiting, c))
    } else {
        None
    };
    let on_target = match gpm.spec.direction {
        Direction::Forward => i64::from(counts.migrated),
        Direction::Rollback => [counts.migrated, counts.in_progress, counts.failed]
            .into_iter()
            .fold(i64::from(counts.total), |left, n| left - i64::from(n)),
    };
    Snapshot {
        name: gpm.name_any(),
        has_status: status.is_some(),
        phase,
        direction: gpm.spec.direction,
        paused: gpm.spec.paused,
        deleting: gpm.metadata.deletion_timestamp.is_some(),
        stale: matches!(
            (gpm.metadata.generation, status.and_then(|s| s.observed_generation)),
            (Some(generation), Some(observed)) if observed < generation
        ),
        counts,
        on_target: u64::try_from(on_target).unwrap_or(0),
        attention,
        nodes: status
            .map(|s| s.in_progress.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|n| NodeLine {
                name: n.name.clone(),
                state: n.state,
                for_seconds: n.since.as_ref().map(|since| seconds_between(since.0, now)),
                message: one_line(&n.message),
                admin_cordon: n.cordoned_by == Some(CordonHolder::Admin),
            })
            .collect(),
        failed: status
            .map(|s| s.failed.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|f| FailedLine {
                name: f.name.clone(),
                state: f.state,
                reason: f.reason.clone(),
                message: one_line(&f.message),
            })
            .collect(),
        moving_since: reconciling.map(|c| c.last_transition_time.0),
        device_plugin_removable: find(ConditionType::DevicePluginRemovable, "True")
            .map(|c| one_line(&c.message)),
        pods: status.and_then(|s| s.pods.clone()),
        replace: status.and_then(|s| s.replace.clone()),
    }
}

fn attention(kind: AttentionKind, c: &Condition) -> Attention {
    Attention { kind, reason: c.reason.clone(), message: one_line(&c.message) }
}

/// Whole seconds from `from` to `to`; 0 when clocks disagree and `from` is in the future.
fn seconds_between(from: Timestamp, to: Timestamp) -> u64 {
    u64::try_from(to.as_second() - from.as_second()).unwrap_or(0)
}

/// Operator messages may span lines (one per placement problem); a status line may not.
fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// The exit code once the migration has ended, `None` while it goes on: 0 for Completed and
/// RolledBack, [`EXIT_FINDINGS`] for Failed. A status written for an older generation of the spec
/// is not trusted to have ended.
pub fn exit_code(s: &Snapshot) -> Option<u8> {
    if s.stale {
        return None;
    }
    match s.phase? {
        Phase::Completed | Phase::RolledBack => Some(0),
        Phase::Failed => Some(EXIT_FINDINGS),
        Phase::Pending | Phase::Progressing | Phase::Paused | Phase::RollingBack => None,
    }
}

/// A duration as people read it on a status line: `12s`, `1m12s`, `1h01m`.
pub fn format_duration(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
    }
}

fn phase_str(p: Phase) -> &'static str {
    match p {
        Phase::Pending => "Pending",
        Phase::Progressing => "Progressing",
        Phase::Paused => "Paused",
        Phase::Completed => "Completed",
        Phase::Failed => "Failed",
        Phase::RollingBack => "RollingBack",
        Phase::RolledBack => "RolledBack",
    }
}

/// Where the nodes that are done stand, in words.
fn target_str(d: Direction) -> &'static str {
    match d {
        Direction::Forward => "on DRA",
        Direction::Rollback => "on the device plugin",
    }
}

/// The state a node reaches when it leaves the in-progress list without failing.
fn arrived_state(d: Direction) -> NodeState {
    match d {
        Direction::Forward => NodeState::Migrated,
        Direction::Rollback => NodeState::RolledBack,
    }
}

impl Attention {
    fn text(&self) -> String {
        let kind = match self.kind {
            AttentionKind::Stalled => "Stalled",
            AttentionKind::Waiting => "waiting",
        };
        if self.message.is_empty() {
            format!("{kind} ({})", self.reason)
        } else {
            format!("{kind} ({}): {}", self.reason, self.message)
        }
    }
}

/// The pool's state in one line, without the name: `Progressing 2/6 migrated, 2 moving`.
pub fn summary(s: &Snapshot) -> String {
    if !s.has_status {
        return "no status yet (is the operator running?)".to_string();
    }
    let done = match s.direction {
        Direction::Forward => "migrated",
        Direction::Rollback => "rolled back",
    };
    format!(
        "{} {}/{} {done}{}",
        s.phase.map_or("Unknown", phase_str),
        s.on_target,
        s.counts.total,
        details(s)
    )
}

/// The message beside the pool bar, which shows the counts itself: `on DRA - Progressing, 2 moving`.
fn bar_message(s: &Snapshot) -> String {
    if !s.has_status {
        return summary(s);
    }
    format!("{} - {}{}", target_str(s.direction), s.phase.map_or("Unknown", phase_str), details(s))
}

/// What follows the phase and counts: nodes moving and failed, pause, deletion, a stale status and
/// the condition that explains a standstill.
fn details(s: &Snapshot) -> String {
    let mut out = String::new();
    if s.counts.in_progress > 0 {
        out.push_str(&format!(", {} moving", s.counts.in_progress));
    }
    if s.counts.failed > 0 {
        out.push_str(&format!(", {} failed", s.counts.failed));
    }
    if s.counts.refused > 0 {
        out.push_str(&format!(", {} refused", s.counts.refused));
    }
    if s.paused && s.phase != Some(Phase::Paused) {
        out.push_str(", paused");
    }
    if s.deleting {
        out.push_str(", being deleted");
    }
    if s.stale {
        out.push_str(" (status not yet updated for the latest spec change)");
    }
    if let Some(a) = &s.attention {
        out.push_str(" - ");
        out.push_str(&a.text());
    }
    out
}

/// The pool line: `pool demo: Progressing 2/6 migrated, 2 moving`.
pub fn pool_line(s: &Snapshot) -> String {
    format!("pool {}: {}", s.name, summary(s))
}

/// A node in flight, for the Lines view: `gpu-node-3  Draining  (12s)  Evicting 2 pod(s)`.
fn node_text(n: &NodeLine) -> String {
    let mut out = format!("{}  {}", n.name, state_str(n.state));
    if let Some(secs) = n.for_seconds {
        out.push_str(&format!("  ({})", format_duration(secs)));
    }
    let message = node_message(n);
    if !message.is_empty() {
        out.push_str("  ");
        out.push_str(&message);
    }
    out
}

/// A node in flight with aligned columns, for the bars and `--once`.
fn node_column_text(n: &NodeLine, name_width: usize) -> String {
    let secs = n.for_seconds.map(format_duration).unwrap_or_default();
    let line = format!(
        "{:name_width$}  {:STATE_WIDTH$}  {secs:>6}  {}",
        n.name,
        state_str(n.state),
        node_message(n)
    );
    line.trim_end().to_string()
}

/// The step's message, after what says the node stays cordoned once it has moved.
fn node_message(n: &NodeLine) -> String {
    match (n.admin_cordon, n.message.is_empty()) {
        (false, _) => n.message.clone(),
        (true, true) => ADMIN_CORDON.to_string(),
        (true, false) => format!("{ADMIN_CORDON}; {}", n.message),
    }
}

/// What `switchyard status` says of a node whose cordon is an admin's (`cordonedBy: Admin`).
const ADMIN_CORDON: &str = "admin's cordon: stays cordoned";

/// A failed node: `gpu-node-5  Failed in Draining  DrainTimeout: ...`.
fn failed_text(f: &FailedLine) -> String {
    let mut out = format!("{}  Failed in {}  {}", f.name, state_str(f.state), f.reason);
    if !f.message.is_empty() {
        out.push_str(": ");
        out.push_str(&f.message);
    }
    out
}

/// The last line of a followed migration: `migration demo Completed: 6/6 nodes on DRA in 2m14s`.
/// `elapsed` is `None` when the migration had ended before `status` started watching.
pub fn final_line(s: &Snapshot, elapsed: Option<u64>) -> String {
    let phase = s.phase.map_or("Unknown", phase_str);
    let mut out = format!(
        "migration {} {phase}: {}/{} nodes {}",
        s.name,
        s.on_target,
        s.counts.total,
        target_str(s.direction)
    );
    if let Some(secs) = elapsed {
        out.push_str(&format!(" in {}", format_duration(secs)));
    }
    if s.counts.failed > 0 {
        out.push_str(&format!(", {} failed", s.counts.failed));
    }
    out
}

/// What `--once` prints: the pool line, the nodes in flight, the failed nodes, and the device
/// plugin's removal once it may go.
pub fn once_lines(s: &Snapshot) -> Vec<String> {
    let width = s.nodes.iter().map(|n| n.name.len()).max().unwrap_or(0);
    let mut out = vec![pool_line(s)];
    out.extend(s.nodes.iter().map(|n| format!("  {}", node_column_text(n, width))));
    out.extend(s.failed.iter().map(|f| format!("  {}", failed_text(f))));
    out.extend(pods_lines(s));
    out.extend(replace_lines(s));
    out.extend(device_plugin_line(s));
    out
}

/// How many replaced nodes `replace_lines` names.
const REPLACED_NAMED: usize = 10;

/// A Replace migration's target room as last checked, and the old nodes left for removal.
pub fn replace_lines(s: &Snapshot) -> Vec<String> {
    let Some(r) = &s.replace else { return Vec::new() };
    let rooms: Vec<String> =
        r.capacity.iter().map(|c| format!("{} {} of {} free", c.resource, c.free, c.devices)).collect();
    let mut out = vec![format!(
        "target pool: {} Ready, schedulable node(s){}",
        r.target_nodes,
        if rooms.is_empty() { String::new() } else { format!("; {}", rooms.join(", ")) }
    )];
    if !r.replaced_nodes.is_empty() {
        let shown: Vec<&str> = r.replaced_nodes.iter().take(REPLACED_NAMED).map(String::as_str).collect();
        let more = s.counts.migrated as usize - shown.len().min(s.counts.migrated as usize);
        out.push(format!(
            "replaced, cordoned for removal (label switchyard.dev/replaced): {}{}",
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ));
    }
    out
}

/// How many unverified pods `pods_lines` names.
const PODS_NAMED: usize = 5;

/// `pods on migrated nodes: ...` once the operator has checked them, then one line per pod that
/// is not verified (the first few).
pub fn pods_lines(s: &Snapshot) -> Vec<String> {
    let Some(p) = &s.pods else { return Vec::new() };
    let mut out = vec![if p.unverified == 0 {
        format!("pods on migrated nodes: {} GPU pod(s) verified on the driver's devices", p.verified)
    } else {
        format!("pods on migrated nodes: {} verified, {} NOT verified", p.verified, p.unverified)
    }];
    out.extend(p.unverified_pods.iter().take(PODS_NAMED).map(|u| {
        format!("  {}/{} on {}: {}: {}", u.namespace, u.name, u.node, u.reason, one_line(&u.message))
    }));
    if p.unverified as usize > PODS_NAMED {
        out.push(format!(
            "  and {} more (kubectl get gpm {} -o jsonpath='{{.status.pods}}')",
            p.unverified as usize - PODS_NAMED,
            s.name
        ));
    }
    out
}

/// `device plugin removable: ...` while the `DevicePluginRemovable` condition is True.
pub fn device_plugin_line(s: &Snapshot) -> Option<String> {
    s.device_plugin_removable.as_ref().map(|m| format!("device plugin removable: {m}"))
}

/// How long the migration took, for the final line. The start is the earliest
/// `Reconciling=True` transition seen (when the operator began moving nodes, which may be before
/// `status` started; pauses in between count), or else the moment `status` first read the
/// object. A migration that had already ended when `status` started has no duration to report.
#[derive(Clone, Debug)]
struct Stopwatch {
    first_seen: Timestamp,
    moving_since: Option<Timestamp>,
    ended_before: bool,
}

impl Stopwatch {
    fn new(first: &Snapshot, now: Timestamp) -> Self {
        let mut w = Self { first_seen: now, moving_since: None, ended_before: exit_code(first).is_some() };
        w.observe(first);
        w
    }

    fn observe(&mut self, s: &Snapshot) {
        if let Some(t) = s.moving_since {
            self.moving_since = Some(self.moving_since.map_or(t, |m| m.min(t)));
        }
    }

    fn elapsed(&self, now: Timestamp) -> Option<u64> {
        (!self.ended_before).then(|| seconds_between(self.moving_since.unwrap_or(self.first_seen), now))
    }
}

/// What kind of change a [`Line`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    /// Phase, counts or the explaining condition changed.
    Pool,
    /// A node entered the in-progress list, or its step or message changed.
    Node,
    /// A node left the in-progress list without failing: it reached the target backend.
    Arrived,
    /// A node appeared in the failed list.
    Failed,
}

/// One line of the Lines view, without its timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// What changed.
    pub kind: LineKind,
    /// The text.
    pub text: String,
}

/// Remembers what was last printed, so that each change is printed once and nothing else is.
/// Time in state is printed with a node line but is not a change by itself.
#[derive(Clone, Debug, Default)]
pub struct LineLog {
    pool: Option<String>,
    nodes: BTreeMap<String, (NodeState, String)>,
    failed: BTreeSet<String>,
}

impl LineLog {
    /// The lines `s` deserves after the snapshots seen so far: the pool line when it changed,
    /// nodes that arrived, nodes that entered or changed step or message, and new failures.
    pub fn update(&mut self, s: &Snapshot) -> Vec<Line> {
        let mut out = Vec::new();
        let pool = pool_line(s);
        if self.pool.as_ref() != Some(&pool) {
            out.push(Line { kind: LineKind::Pool, text: pool.clone() });
            self.pool = Some(pool);
        }

        let failed: BTreeSet<String> = s.failed.iter().map(|f| f.name.clone()).collect();
        let current: BTreeSet<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
        let left: Vec<String> =
            self.nodes.keys().filter(|name| !current.contains(name.as_str())).cloned().collect();
        for name in left {
            self.nodes.remove(&name);
            if !failed.contains(&name) {
                let text = format!("{name}  {}", state_str(arrived_state(s.direction)));
                out.push(Line { kind: LineKind::Arrived, text });
            }
        }

        for n in &s.nodes {
            let key = (n.state, n.message.clone());
            if self.nodes.get(&n.name) != Some(&key) {
                out.push(Line { kind: LineKind::Node, text: node_text(n) });
                self.nodes.insert(n.name.clone(), key);
            }
        }

        for f in s.failed.iter().filter(|f| !self.failed.contains(&f.name)) {
            out.push(Line { kind: LineKind::Failed, text: failed_text(f) });
        }
        // A node that leaves the failed list (re-queued by a human) is reported again if it
        // fails again.
        self.failed = failed;
        out
    }
}

/// Bars view: one bar for the pool and one spinner line per node in flight. Arrivals, failures and
/// the condition that explains a standstill are printed above the bars, in full (a bar line is cut
/// at the terminal's width), and stay on screen once the bars are cleared.
struct Bars {
    multi: MultiProgress,
    pool: ProgressBar,
    node_style: ProgressStyle,
    nodes: BTreeMap<String, ProgressBar>,
    log: LineLog,
    attention: Option<Attention>,
}

impl Bars {
    fn new(target: ProgressDrawTarget) -> anyhow::Result<Self> {
        let multi = MultiProgress::with_draw_target(target);
        let pool_style =
            ProgressStyle::with_template("{prefix:.bold} [{bar:24.cyan/blue}] {pos}/{len} {wide_msg}")
                .context("progress bar template")?
                .progress_chars("=> ");
        let node_style =
            ProgressStyle::with_template("  {spinner:.green} {wide_msg}").context("progress bar template")?;
        let pool = multi.add(ProgressBar::new(0).with_style(pool_style));
        Ok(Self { multi, pool, node_style, nodes: BTreeMap::new(), log: LineLog::default(), attention: None })
    }

    fn render(&mut self, s: &Snapshot) -> std::io::Result<()> {
        self.pool.set_prefix(s.name.clone());
        self.pool.set_length(u64::try_from(s.counts.total).unwrap_or(0));
        self.pool.set_position(s.on_target);
        self.pool.set_message(bar_message(s));

        let current: BTreeSet<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
        self.nodes.retain(|name, bar| {
            let keep = current.contains(name.as_str());
            if !keep {
                bar.finish_and_clear();
                self.multi.remove(bar);
            }
            keep
        });
        let width = s.nodes.iter().map(|n| n.name.len()).max().unwrap_or(0);
        for n in &s.nodes {
            let bar = self.nodes.entry(n.name.clone()).or_insert_with(|| {
                self.multi.add(ProgressBar::new_spinner().with_style(self.node_style.clone()))
            });
            bar.set_message(node_column_text(n, width));
            bar.tick();
        }

        for line in self.log.update(s) {
            if matches!(line.kind, LineKind::Arrived | LineKind::Failed) {
                self.multi.println(line.text)?;
            }
        }
        if s.attention != self.attention {
            if let Some(a) = &s.attention {
                self.multi.println(format!("{}: {}", s.name, a.text()))?;
                self.multi.println(format!("  what to do: {}", runbook(&a.reason)))?;
            }
            self.attention = s.attention.clone();
        }
        Ok(())
    }

    fn clear(&mut self) -> std::io::Result<()> {
        for bar in self.nodes.values() {
            bar.finish_and_clear();
        }
        self.nodes.clear();
        self.pool.finish_and_clear();
        self.multi.clear()
    }
}

/// Whether to draw bars: `auto` draws them only on a terminal.
fn use_bars(view: View, stdout_is_terminal: bool) -> bool {
    match view {
        View::Bars => true,
        View::Lines => false,
        View::Auto => stdout_is_terminal,
    }
}

enum Renderer {
    Bars(Box<Bars>),
    Lines(LineLog),
}

impl Renderer {
    fn render(&mut self, s: &Snapshot) -> anyhow::Result<()> {
        match self {
            Renderer::Bars(bars) => bars.render(s)?,
            Renderer::Lines(log) => {
                let lines = log.update(s);
                if !lines.is_empty() {
                    let clock = chrono::Local::now().format("%H:%M:%S");
                    let mut out = std::io::stdout().lock();
                    for line in lines {
                        writeln!(out, "{clock}  {}", line.text)?;
                    }
                    out.flush()?;
                }
            }
        }
        Ok(())
    }

    /// A message on stderr that does not tear the bars.
    fn warn(&self, message: &str) {
        match self {
            Renderer::Bars(bars) => bars.multi.suspend(|| eprintln!("warning: {message}")),
            Renderer::Lines(_) => eprintln!("warning: {message}"),
        }
    }

    /// Takes the bars off the screen; lines stay.
    fn clear(&mut self) -> anyhow::Result<()> {
        if let Renderer::Bars(bars) = self {
            bars.clear()?;
        }
        Ok(())
    }
}

/// Follows the migration; returns the exit code: 0 when it completed or rolled back (or, with
/// `--once`, after printing it), [`EXIT_FINDINGS`] when it failed, 130 on Ctrl-C. Timing out, the
/// object going away and errors talking to the cluster are errors (exit 1).
pub async fn run(client: Client, args: &StatusArgs) -> anyhow::Result<u8> {
    let api = Api::<GpuPoolMigration>::all(client);
    let name = &args.name;
    let gpm = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading gpupoolmigration {name}"))?
        .ok_or_else(|| anyhow::anyhow!("gpupoolmigration {name} not found"))?;
    if args.once {
        let mut out = std::io::stdout().lock();
        for line in once_lines(&snapshot(&gpm, Timestamp::now())) {
            writeln!(out, "{line}")?;
        }
        return Ok(0);
    }
    let renderer = if use_bars(args.view, std::io::stdout().is_terminal()) {
        Renderer::Bars(Box::new(Bars::new(ProgressDrawTarget::stdout())?))
    } else {
        Renderer::Lines(LineLog::default())
    };
    follow(api, gpm, args, renderer).await
}

/// Watch errors that retrying does not fix: no permission to watch, or the resource is gone (the
/// CRD was deleted). Everything else (a dropped connection, an expired resourceVersion, a
/// restarting API server) is retried with backoff.
fn gives_up(e: &watcher::Error) -> bool {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s,
        _ => return false,
    };
    matches!(status.code, 401 | 403 | 404)
}

async fn follow(
    api: Api<GpuPoolMigration>,
    mut gpm: GpuPoolMigration,
    args: &StatusArgs,
    mut view: Renderer,
) -> anyhow::Result<u8> {
    let name = &args.name;
    let start = Timestamp::now();
    let mut stopwatch = Stopwatch::new(&snapshot(&gpm, start), start);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = pin!(watcher(api, config).default_backoff());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut ctrl_c = pin!(tokio::signal::ctrl_c());
    let timeout = args.timeout;
    let mut deadline = pin!(async move {
        if timeout > 0 {
            tokio::time::sleep(Duration::from_secs(timeout)).await;
        } else {
            std::future::pending::<()>().await;
        }
    });
    // Whether the object was in the watch's latest (re)list: if a relist ends without it, it was
    // deleted while the watch was down and no Delete event will come.
    let mut listed = true;
    let mut drawn: Option<std::time::Instant> = None;
    loop {
        let now = Timestamp::now();
        let snap = snapshot(&gpm, now);
        stopwatch.observe(&snap);
        let done = exit_code(&snap);
        let lines = matches!(view, Renderer::Lines(_));
        if lines || done.is_some() || drawn.is_none_or(|at| at.elapsed() >= REDRAW_MIN) {
            view.render(&snap)?;
            drawn = Some(std::time::Instant::now());
        }
        if let Some(code) = done {
            view.clear()?;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", final_line(&snap, stopwatch.elapsed(now)))?;
            for line in pods_lines(&snap) {
                writeln!(out, "{line}")?;
            }
            if let Some(line) = device_plugin_line(&snap) {
                writeln!(out, "{line}")?;
            }
            return Ok(code);
        }
        tokio::select! {
            _ = tick.tick() => {}
            event = events.next() => match event {
                Some(Ok(Event::Apply(o) | Event::InitApply(o))) => {
                    gpm = o;
                    listed = true;
                }
                Some(Ok(Event::Init)) => listed = false,
                Some(Ok(Event::InitDone)) if listed => {}
                Some(Ok(Event::InitDone | Event::Delete(_))) => {
                    view.clear()?;
                    anyhow::bail!("gpupoolmigration {name} was deleted");
                }
                Some(Err(e)) if gives_up(&e) => {
                    view.clear()?;
                    return Err(e).with_context(|| format!("watching gpupoolmigration {name}"));
                }
                Some(Err(e)) => view.warn(&format!("watching gpupoolmigration {name}: {e}; retrying")),
                None => {
                    view.clear()?;
                    anyhow::bail!("the watch on gpupoolmigration {name} ended");
                }
            },
            signal = &mut ctrl_c => {
                view.clear()?;
                signal.context("listening for Ctrl-C")?;
                eprintln!("stopped following migration {name}: {}", summary(&snap));
                return Ok(EXIT_INTERRUPTED);
            }
            () = &mut deadline => {
                view.clear()?;
                anyhow::bail!("timed out after {timeout}s following migration {name}: {}", summary(&snap));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// 2026-01-01T00:00:00Z, the instant the conditions and `since` fields below are relative to.
    const T0: i64 = 1_767_225_600;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(T0 + secs).unwrap()
    }

    fn rfc3339(secs: i64) -> String {
        at(secs).to_string()
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str, since: i64) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": rfc3339(since)})
    }

    fn gpm(direction: &str, generation: i64, status: serde_json::Value) -> GpuPoolMigration {
        let mut obj = json!({
            "apiVersion": "switchyard.dev/v1alpha1",
            "kind": "GpuPoolMigration",
            "metadata": {"name": "demo", "generation": generation},
            "spec": {
                "nodeSelector": {"matchLabels": {"pool": "a100"}},
                "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev"}],
                "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "switchyard", "name": "driver"}},
                "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "nvidia-device-plugin"}},
                "direction": direction
            }
        });
        if !status.is_null() {
            obj["status"] = status;
        }
        serde_json::from_value(obj).unwrap()
    }

    /// Forward, 6 nodes: 2 migrated, gpu-node-3 draining for 72 s, gpu-node-4 cordoned (no
    /// `since`), gpu-node-5 failed; nodes began moving at T0.
    fn progressing() -> GpuPoolMigration {
        gpm(
            "Forward",
            1,
            json!({
                "observedGeneration": 1,
                "phase": "Progressing",
                "nodes": {"total": 6, "pending": 1, "inProgress": 2, "migrated": 2, "failed": 1},
                "inProgress": [
                    {"name": "gpu-node-3", "state": "Draining", "since": rfc3339(100),
                     "message": "Evicting 2 pod(s)\nwaiting on train-0"},
                    {"name": "gpu-node-4", "state": "Cordoned", "cordonedBy": "Admin"}
                ],
                "failed": [{"name": "gpu-node-5", "state": "Draining", "reason": "DrainTimeout",
                            "message": "pod a/b did not leave in 600s"}],
                "conditions": [
                    cond("Ready", "False", "NodesMoving", "2 node(s) moving, 2 of 6 migrated", 0),
                    cond("Reconciling", "True", "NodesMoving", "2 node(s) moving, 2 of 6 migrated", 0),
                    cond("Stalled", "False", "NoHumanNeeded", "", 0)
                ]
            }),
        )
    }

    fn with_status(mut g: GpuPoolMigration, f: impl FnOnce(&mut serde_json::Value)) -> GpuPoolMigration {
        let mut status = serde_json::to_value(g.status.take().unwrap()).unwrap();
        f(&mut status);
        g.status = Some(serde_json::from_value(status).unwrap());
        g
    }

    #[test]
    fn snapshot_of_a_progressing_migration() {
        let s = snapshot(&progressing(), at(172));
        assert!(s.has_status);
        assert_eq!(s.name, "demo");
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert_eq!((s.on_target, s.counts.total, s.counts.failed), (2, 6, 1));
        assert!(!s.stale && !s.paused && !s.deleting);
        assert_eq!(s.attention, None, "a reconciling migration needs no explanation");
        assert_eq!(s.moving_since, Some(at(0)));
        assert_eq!(
            s.nodes,
            vec![
                NodeLine {
                    name: "gpu-node-3".into(),
                    state: NodeState::Draining,
                    for_seconds: Some(72),
                    message: "Evicting 2 pod(s); waiting on train-0".into(),
                    admin_cordon: false,
                },
                NodeLine {
                    name: "gpu-node-4".into(),
                    state: NodeState::Cordoned,
                    for_seconds: None,
                    message: String::new(),
                    admin_cordon: true,
                },
            ]
        );
        assert_eq!(
            s.failed,
            vec![FailedLine {
                name: "gpu-node-5".into(),
                state: NodeState::Draining,
                reason: "DrainTimeout".into(),
                message: "pod a/b did not leave in 600s".into(),
            }]
        );
        assert_eq!(pool_line(&s), "pool demo: Progressing 2/6 migrated, 2 moving, 1 failed");
        assert_eq!(snapshot(&progressing(), at(50)).nodes[0].for_seconds, Some(0), "since in the future");
    }

    #[test]
    fn snapshot_shows_why_a_stalled_migration_does_not_move() {
        let g = with_status(progressing(), |st| {
            st["phase"] = json!("Paused");
            st["conditions"] = json!([
                cond("Ready", "False", "NodeFailed", "node gpu-node-5 failed", 0),
                cond("Reconciling", "False", "Idle", "", 30),
                cond(
                    "Stalled",
                    "True",
                    "PlacementMissing",
                    "DaemonSet gpu/a: add affinity\nDaemonSet b: too",
                    30
                ),
            ]);
        });
        let s = snapshot(&g, at(60));
        assert_eq!(
            s.attention,
            Some(Attention {
                kind: AttentionKind::Stalled,
                reason: "PlacementMissing".into(),
                message: "DaemonSet gpu/a: add affinity; DaemonSet b: too".into(),
            })
        );
        assert_eq!(s.moving_since, None);
        assert_eq!(
            summary(&s),
            "Paused 2/6 migrated, 2 moving, 1 failed - Stalled (PlacementMissing): DaemonSet gpu/a: add affinity; DaemonSet b: too"
        );
    }

    #[test]
    fn snapshot_says_what_an_idle_migration_waits_for() {
        let g = with_status(progressing(), |st| {
            st["phase"] = json!("Paused");
            st["conditions"] = json!([
                cond("Ready", "False", "Paused", "spec.paused is true", 0),
                cond("Reconciling", "False", "Idle", "", 0),
                cond("Stalled", "False", "NoHumanNeeded", "", 0),
            ]);
        });
        let s = snapshot(&g, at(0));
        let a = s.attention.as_ref().unwrap();
        assert_eq!((a.kind, a.reason.as_str()), (AttentionKind::Waiting, "Paused"));
        assert!(summary(&s).ends_with(" - waiting (Paused): spec.paused is true"), "{}", summary(&s));

        // Done: Ready=False leftovers are not shown as something to wait for.
        let g = with_status(g, |st| st["phase"] = json!("Completed"));
        assert_eq!(snapshot(&g, at(0)).attention, None);
    }

    #[test]
    fn rollback_progress_counts_nodes_back_on_the_device_plugin() {
        // 6 nodes: 3 still on DRA and waiting, 1 rolling back, 2 back on the device plugin.
        let g = gpm(
            "Rollback",
            2,
            json!({
                "observedGeneration": 2,
                "phase": "RollingBack",
                "nodes": {"total": 6, "pending": 2, "inProgress": 1, "migrated": 3, "failed": 0},
                "inProgress": [{"name": "gpu-node-1", "state": "RollingBack"}]
            }),
        );
        let s = snapshot(&g, at(0));
        assert_eq!(s.on_target, 2);
        assert_eq!(pool_line(&s), "pool demo: RollingBack 2/6 rolled back, 1 moving");
        let done = with_status(g, |st| {
            st["phase"] = json!("RolledBack");
            st["nodes"] = json!({"total": 6, "pending": 6, "inProgress": 0, "migrated": 0, "failed": 0});
            st["inProgress"] = json!([]);
        });
        assert_eq!(
            final_line(&snapshot(&done, at(0)), Some(62)),
            "migration demo RolledBack: 6/6 nodes on the device plugin in 1m02s"
        );
    }

    #[test]
    fn a_status_for_an_older_spec_is_not_trusted_to_have_ended() {
        // Completed going forward, then the direction was flipped and the operator has not caught up.
        let g = gpm(
            "Rollback",
            2,
            json!({"observedGeneration": 1, "phase": "Completed",
                   "nodes": {"total": 6, "pending": 0, "inProgress": 0, "migrated": 6, "failed": 0}}),
        );
        let s = snapshot(&g, at(0));
        assert!(s.stale);
        assert_eq!(exit_code(&s), None);
        assert!(summary(&s).contains("not yet updated"), "{}", summary(&s));
    }

    #[test]
    fn refused_nodes_are_counted_and_a_pool_that_moves_none_of_them_has_not_succeeded() {
        let g = gpm(
            "Forward",
            1,
            json!({"observedGeneration": 1, "phase": "Failed",
                   "nodes": {"total": 0, "pending": 0, "inProgress": 0, "migrated": 0, "failed": 0, "refused": 2},
                   "conditions": [cond("Stalled", "True", "NodesRefused", "2 selected node(s) are refused", 0)]}),
        );
        let s = snapshot(&g, at(0));
        assert_eq!(s.counts.refused, 2);
        assert!(
            summary(&s).starts_with("Failed 0/0 migrated, 2 refused - Stalled (NodesRefused)"),
            "{}",
            summary(&s)
        );
        assert_eq!(exit_code(&s), Some(2), "Failed is not success");
    }

    #[test]
    fn a_migration_without_status_waits_for_the_operator() {
        let s = snapshot(&gpm("Forward", 1, serde_json::Value::Null), at(0));
        assert!(!s.has_status);
        assert_eq!(exit_code(&s), None);
        assert_eq!(pool_line(&s), "pool demo: no status yet (is the operator running?)");
        assert_eq!(once_lines(&s), vec![pool_line(&s)]);
    }

    #[test]
    fn exit_code_per_phase() {
        let cases = [
            ("Pending", None),
            ("Progressing", None),
            ("Paused", None),
            ("RollingBack", None),
            ("Completed", Some(0)),
            ("RolledBack", Some(0)),
            ("Failed", Some(EXIT_FINDINGS)),
        ];
        for (phase, code) in cases {
            let g = with_status(progressing(), |st| st["phase"] = json!(phase));
            assert_eq!(exit_code(&snapshot(&g, at(0))), code, "{phase}");
        }
    }

    #[test]
    fn durations_read_like_a_clock() {
        let cases = [
            (0, "0s"),
            (12, "12s"),
            (59, "59s"),
            (60, "1m00s"),
            (72, "1m12s"),
            (3599, "59m59s"),
            (3700, "1h01m"),
        ];
        for (secs, text) in cases {
            assert_eq!(format_duration(secs), text, "{secs}");
        }
        assert_eq!(format_duration(90_000), "25h00m");
    }

    #[test]
    fn final_lines() {
        let completed = with_status(progressing(), |st| {
            st["phase"] = json!("Completed");
            st["nodes"] = json!({"total": 6, "pending": 0, "inProgress": 0, "migrated": 6, "failed": 0});
        });
        let s = snapshot(&completed, at(0));
        assert_eq!(final_line(&s, Some(134)), "migration demo Completed: 6/6 nodes on DRA in 2m14s");
        assert_eq!(final_line(&s, None), "migration demo Completed: 6/6 nodes on DRA");
        assert_eq!(device_plugin_line(&s), None, "no DevicePluginRemovable condition");
        let removable = with_status(completed.clone(), |st| {
            st["conditions"] = json!([cond(
                "DevicePluginRemovable",
                "True",
                "DevicePluginUnused",
                "DaemonSet gpu/plugin runs on no node: delete it (the runbook's last step)",
                0
            )]);
        });
        let s = snapshot(&removable, at(0));
        assert_eq!(
            device_plugin_line(&s).as_deref(),
            Some(
                "device plugin removable: DaemonSet gpu/plugin runs on no node: delete it (the runbook's last step)"
            )
        );
        assert_eq!(once_lines(&s).last(), device_plugin_line(&s).as_ref());
        assert!(pods_lines(&s).is_empty(), "no status.pods");
        let checked = with_status(completed.clone(), |st| {
            st["pods"] = json!({"verified": 5, "unverified": 1, "unverifiedPods": [
                {"node": "gpu-2", "namespace": "ml", "name": "late", "reason": "HoldsDevicePluginGpu",
                 "message": "container main requests nvidia.com/gpu with no DRA claim behind it"}]});
        });
        assert_eq!(
            pods_lines(&snapshot(&checked, at(0))),
            [
                "pods on migrated nodes: 5 verified, 1 NOT verified",
                "  ml/late on gpu-2: HoldsDevicePluginGpu: container main requests nvidia.com/gpu with no DRA claim behind it"
            ]
        );
        let failed = with_status(progressing(), |st| {
            st["phase"] = json!("Failed");
            st["nodes"] = json!({"total": 6, "pending": 0, "inProgress": 0, "migrated": 4, "failed": 2});
        });
        assert_eq!(
            final_line(&snapshot(&failed, at(0)), Some(181)),
            "migration demo Failed: 4/6 nodes on DRA in 3m01s, 2 failed"
        );
    }

    #[test]
    fn lines_print_each_change_once() {
        let mut log = LineLog::default();
        let texts = |lines: Vec<Line>| lines.into_iter().map(|l| (l.kind, l.text)).collect::<Vec<_>>();

        let first = texts(log.update(&snapshot(&progressing(), at(112))));
        assert_eq!(
            first,
            vec![
                (LineKind::Pool, "pool demo: Progressing 2/6 migrated, 2 moving, 1 failed".to_string()),
                (
                    LineKind::Node,
                    "gpu-node-3  Draining  (12s)  Evicting 2 pod(s); waiting on train-0".to_string()
                ),
                (LineKind::Node, "gpu-node-4  Cordoned  admin's cordon: stays cordoned".to_string()),
                (
                    LineKind::Failed,
                    "gpu-node-5  Failed in Draining  DrainTimeout: pod a/b did not leave in 600s".to_string()
                ),
            ]
        );

        // Time passes, nothing else changes: nothing to print.
        assert_eq!(log.update(&snapshot(&progressing(), at(500))), vec![]);

        // gpu-node-3 switches, gpu-node-4 arrives on DRA, gpu-node-6 starts.
        let next = with_status(progressing(), |st| {
            st["nodes"] = json!({"total": 6, "pending": 0, "inProgress": 2, "migrated": 3, "failed": 1});
            st["inProgress"] = json!([
                {"name": "gpu-node-3", "state": "Switching", "since": rfc3339(200)},
                {"name": "gpu-node-6", "state": "Cordoned", "since": rfc3339(205)}
            ]);
        });
        assert_eq!(
            texts(log.update(&snapshot(&next, at(210)))),
            vec![
                (LineKind::Pool, "pool demo: Progressing 3/6 migrated, 2 moving, 1 failed".to_string()),
                (LineKind::Arrived, "gpu-node-4  Migrated".to_string()),
                (LineKind::Node, "gpu-node-3  Switching  (10s)".to_string()),
                (LineKind::Node, "gpu-node-6  Cordoned  (5s)".to_string()),
            ]
        );
        assert_eq!(log.update(&snapshot(&next, at(260))), vec![]);

        // gpu-node-6 fails: it is reported as failed, not as arrived.
        let failed = with_status(next, |st| {
            st["nodes"] = json!({"total": 6, "pending": 0, "inProgress": 1, "migrated": 3, "failed": 2});
            st["inProgress"] = json!([{"name": "gpu-node-3", "state": "Switching", "since": rfc3339(200)}]);
            st["failed"] = json!([
                {"name": "gpu-node-5", "state": "Draining", "reason": "DrainTimeout",
                 "message": "pod a/b did not leave in 600s"},
                {"name": "gpu-node-6", "state": "Cordoned", "reason": "NodeNotReady", "message": ""}
            ]);
        });
        assert_eq!(
            texts(log.update(&snapshot(&failed, at(270)))),
            vec![
                (LineKind::Pool, "pool demo: Progressing 3/6 migrated, 1 moving, 2 failed".to_string()),
                (LineKind::Failed, "gpu-node-6  Failed in Cordoned  NodeNotReady".to_string()),
            ]
        );
    }

    #[test]
    fn lines_report_a_new_message_in_the_same_step() {
        let mut log = LineLog::default();
        log.update(&snapshot(&progressing(), at(112)));
        let g = with_status(progressing(), |st| st["inProgress"][0]["message"] = json!("Evicting 1 pod(s)"));
        let lines = log.update(&snapshot(&g, at(130)));
        assert_eq!(
            lines,
            vec![Line {
                kind: LineKind::Node,
                text: "gpu-node-3  Draining  (30s)  Evicting 1 pod(s)".into()
            }]
        );
    }

    #[test]
    fn once_lists_nodes_in_columns() {
        let lines = once_lines(&snapshot(&progressing(), at(172)));
        assert_eq!(
            lines,
            vec![
                "pool demo: Progressing 2/6 migrated, 2 moving, 1 failed",
                "  gpu-node-3  Draining      1m12s  Evicting 2 pod(s); waiting on train-0",
                "  gpu-node-4  Cordoned             admin's cordon: stays cordoned",
                "  gpu-node-5  Failed in Draining  DrainTimeout: pod a/b did not leave in 600s",
            ]
        );
    }

    #[test]
    fn bars_follow_the_nodes_in_flight() {
        let mut bars = Bars::new(ProgressDrawTarget::hidden()).unwrap();
        bars.render(&snapshot(&progressing(), at(172))).unwrap();
        assert_eq!((bars.pool.position(), bars.pool.length()), (2, Some(6)));
        assert_eq!(bars.pool.prefix(), "demo");
        assert_eq!(bars.pool.message(), "on DRA - Progressing, 2 moving, 1 failed");
        assert_eq!(bars.nodes.keys().collect::<Vec<_>>(), ["gpu-node-3", "gpu-node-4"]);
        assert_eq!(
            bars.nodes["gpu-node-3"].message(),
            "gpu-node-3  Draining      1m12s  Evicting 2 pod(s); waiting on train-0"
        );

        let next = with_status(progressing(), |st| {
            st["nodes"] = json!({"total": 6, "pending": 0, "inProgress": 1, "migrated": 3, "failed": 1});
            st["inProgress"] = json!([{"name": "gpu-node-6", "state": "Cordoned", "since": rfc3339(170)}]);
        });
        bars.render(&snapshot(&next, at(172))).unwrap();
        assert_eq!(bars.pool.position(), 3);
        assert_eq!(bars.nodes.keys().collect::<Vec<_>>(), ["gpu-node-6"]);
        bars.clear().unwrap();
        assert!(bars.nodes.is_empty() && bars.pool.is_finished());
    }

    #[test]
    fn stopwatch_starts_when_nodes_began_moving() {
        // Nodes had been moving for 100 s when status started.
        let first = snapshot(&progressing(), at(100));
        let w = Stopwatch::new(&first, at(100));
        assert_eq!(w.elapsed(at(234)), Some(234));

        // Seen Pending first; Reconciling turned True later: the wait before it does not count.
        let pending = with_status(progressing(), |st| {
            st["phase"] = json!("Pending");
            st["conditions"] = json!([cond("Reconciling", "False", "Idle", "", 0)]);
        });
        let mut w = Stopwatch::new(&snapshot(&pending, at(0)), at(0));
        assert_eq!(w.elapsed(at(10)), Some(10), "nothing moving seen yet: from the first look");
        let moving = with_status(progressing(), |st| {
            st["conditions"] = json!([cond("Reconciling", "True", "NodesMoving", "", 300)]);
        });
        w.observe(&snapshot(&moving, at(300)));
        // A pause and a restart later does not move the start.
        let restarted = with_status(progressing(), |st| {
            st["conditions"] = json!([cond("Reconciling", "True", "NodesMoving", "", 900)]);
        });
        w.observe(&snapshot(&restarted, at(900)));
        assert_eq!(w.elapsed(at(1000)), Some(700));

        // Already over when status started: no duration to claim.
        let done = with_status(progressing(), |st| st["phase"] = json!("Completed"));
        let w = Stopwatch::new(&snapshot(&done, at(0)), at(0));
        assert_eq!(w.elapsed(at(5)), None);
    }

    #[test]
    fn only_permission_and_missing_resource_errors_end_the_watch() {
        use kube::core::Status;
        let api = |code| kube::Error::Api(Status::failure("x", "X").with_code(code).boxed());
        let cases = [
            (watcher::Error::InitialListFailed(api(403)), true),
            (watcher::Error::WatchStartFailed(api(401)), true),
            (watcher::Error::WatchFailed(api(404)), true),
            (watcher::Error::WatchError(Status::failure("gone", "Expired").with_code(410).boxed()), false),
            (watcher::Error::InitialListFailed(api(500)), false),
            (watcher::Error::WatchFailed(api(429)), false),
            (watcher::Error::NoResourceVersion, false),
        ];
        for (e, fatal) in cases {
            assert_eq!(gives_up(&e), fatal, "{e}");
        }
    }

    #[test]
    fn bars_only_on_a_terminal_unless_asked() {
        let cases = [
            (View::Auto, true, true),
            (View::Auto, false, false),
            (View::Bars, false, true),
            (View::Lines, true, false),
        ];
        for (view, terminal, bars) in cases {
            assert_eq!(use_bars(view, terminal), bars, "{view:?} terminal={terminal}");
        }
    }
}
