//! Pool planning: which selected nodes this migration owns, which it refuses, which are in
//! flight, and which may start now without exceeding `maxUnavailable`. Pure: it reads node
//! labels, annotations and conditions; the durable per-node record is on the nodes themselves.

use crate::node::drain;
use crate::node::record::{Failure, PoolNode};
use crate::node::slim::SlimNode;
use crate::node::str_map::LabelQuery;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::Selector;

use crate::api::v1alpha1::{Direction, FailurePolicy, GpuPoolMigrationSpec, NodeCounts, NodeState};

/// Another GpuPoolMigration, to detect nodes that two migrations select.
#[derive(Clone, Debug)]
pub struct OtherMigration {
    pub name: String,
    pub selector: LabelSelector,
}

/// A selected node this migration will not move, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub node: String,
    pub message: String,
}

/// Why no new node starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Halt {
    /// `spec.paused` is true.
    Paused,
    /// A node failed and `onFailure` is Pause.
    NodeFailed(String),
}

/// The plan for one reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes this migration manages.
    pub owned: Vec<String>,
    pub refused: Vec<Refusal>,
    /// Nodes that are mid-move and get a step this reconcile.
    pub in_flight: Vec<String>,
    /// Nodes that may start moving now, cheapest first.
    pub to_start: Vec<String>,
    /// Nodes that still have to move but may not start yet.
    pub queued: Vec<String>,
    /// Nodes that failed and need a human.
    pub failed: Vec<String>,
    pub max_unavailable: u32,
    /// Pool nodes unavailable before this reconcile starts anything: nodes in flight, NotReady
    /// nodes, and failed nodes left cordoned. A node an admin keeps cordoned after it moved, or
    /// cordoned before it started, is not counted: the migration did not take it away, and
    /// counting it would stop the pool for good.
    pub unavailable: u32,
    /// The nodes counted in `unavailable`, for the status message when nothing can start.
    pub unavailable_nodes: Vec<String>,
    pub halt: Option<Halt>,
    pub counts: NodeCounts,
}

impl Plan {
    /// Every owned node is where the direction wants it, with nothing in flight.
    pub fn done(&self) -> bool {
        self.in_flight.is_empty() && self.to_start.is_empty() && self.queued.is_empty()
    }
}

/// `maxUnavailable` as a node count: an integer, or a percentage of the pool rounded down;
/// never less than 1, so a small pool still moves.
pub fn max_unavailable(v: &IntOrString, pool_size: usize) -> Result<u32, String> {
    let n = match v {
        IntOrString::Int(i) if *i >= 1 => *i as u64,
        IntOrString::Int(i) => return Err(format!("maxUnavailable {i} must be at least 1")),
        IntOrString::String(s) => {
            let pct: u64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| {
                    format!("maxUnavailable {s:?} must be an integer or a percentage from 1% to 100%")
                })?;
            pool_size as u64 * pct / 100
        }
    };
    Ok(n.clamp(1, u32::MAX as u64) as u32)
}

/// Where a node stands for the given direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    Done,
    InFlight,
    Candidate,
    Failed,
}

fn standing(node: &PoolNode, direction: Direction, on_failure: FailurePolicy) -> Standing {
    let failure = node.failure();
    let failed_in_rollback = failure.as_ref().is_some_and(Failure::during_rollback);
    use NodeState::*;
    match (direction, node.state()) {
        (_, Cordoned | Draining | Switching | Verifying | RollingBack) => Standing::InFlight,
        (Direction::Forward, Pending) => Standing::Candidate,
        // Rolled back after a failure: the node failed to move, and a human re-queues it by
        // removing its state annotation. Rolled back on purpose: it moves forward again.
        (Direction::Forward, RolledBack) if failure.is_some() => Standing::Failed,
        (Direction::Forward, RolledBack) => Standing::Candidate,
        (Direction::Forward, Migrated | Replaced) => Standing::Done,
        (Direction::Forward, Failed) if on_failure == FailurePolicy::Rollback && !failed_in_rollback => {
            Standing::InFlight
        }
        (Direction::Forward, Failed) => Standing::Failed,
        (Direction::Rollback, Pending | RolledBack) => Standing::Done,
        (Direction::Rollback, Migrated | Replaced) => Standing::Candidate,
        (Direction::Rollback, Failed) if !failed_in_rollback => Standing::InFlight,
        (Direction::Rollback, Failed) => Standing::Failed,
    }
}

/// The query of another migration's selector; `None` when it does not parse (it selects nothing).
fn query(selector: &LabelSelector) -> Option<LabelQuery> {
    Selector::try_from(selector.clone()).ok().map(|s| LabelQuery::from(&s))
}

/// The nodes this migration may move: those it owns already or that no other migration
/// selects. A node another migration owns, or that two select, is refused: moved by neither.
fn owned_nodes<'a>(
    migration: &str,
    nodes: &'a [PoolNode],
    others: &[OtherMigration],
    refused: &mut Vec<Refusal>,
) -> Vec<&'a PoolNode> {
    let mut owned: Vec<&PoolNode> = Vec::new();
    let others: Vec<(&str, Option<LabelQuery>)> = others
        .iter()
        .filter(|o| o.name != migration)
        .map(|o| (o.name.as_str(), query(&o.selector)))
        .collect();
    for n in nodes {
        match n.owner() {
            Some(o) if o != migration => refused.push(Refusal {
                node: n.name.clone(),
                message: format!("node {} belongs to GpuPoolMigration {o}", n.name),
            }),
            Some(_) => owned.push(n),
            None => {
                let also: Vec<&str> = others
                    .iter()
                    .filter(|(_, q)| q.as_ref().is_some_and(|q| q.matches(&n.labels)))
                    .map(|(name, _)| *name)
                    .collect();
                if also.is_empty() {
                    owned.push(n);
                } else {
                    refused.push(Refusal {
                        node: n.name.clone(),
                        message: format!(
                            "node {} is also selected by GpuPoolMigration {}; a node selected by two migrations is moved by neither",
                            n.name,
                            also.join(", ")
                        ),
                    });
                }
            }
        }
    }
    owned
}

/// Whether `node`, which `query` (the pool's `spec.nodeSelector`) does not select, is still a
/// member of `migration`'s pool: the migration owns it (`switchyard.dev/migration`) and it only
/// lost labels GPU Feature Discovery writes (`prerequisites::gfd_written`), which NVIDIA stops
/// writing on nodes its DRA driver serves (dra-driver-nvidia-gpu #1244). A label whose value
/// changed, or any other label, still takes the node out of the pool. Pure.
pub fn kept_member(query: &LabelQuery, node: &SlimNode, migration: &str) -> bool {
    node.labels().get(crate::well_known::LABEL_MIGRATION) == Some(migration)
        && query.matches_but_lost(node.labels(), crate::pool::prerequisites::gfd_written)
}

/// The pool's nodes: those `selector` selects, and those of `owned` (the nodes labelled with the
/// migration's name) that it still keeps ([`kept_member`]), by name. Pure.
pub fn pool_members<N: std::borrow::Borrow<SlimNode> + Clone>(
    selected: Vec<N>,
    owned: &[N],
    selector: &Selector,
    migration: &str,
) -> Vec<N> {
    let query = LabelQuery::from(selector);
    let mut out = selected;
    for n in owned {
        let node = n.borrow();
        if !query.matches(node.labels()) && kept_member(&query, node, migration) {
            out.push(n.clone());
        }
    }
    out.sort_by(|a, b| a.borrow().name().cmp(b.borrow().name()));
    out.dedup_by(|a, b| a.borrow().name() == b.borrow().name());
    out
}

/// How many of a node's pods its move disturbs, which orders the nodes that start (fewest first):
/// the unfinished pods that consume the pool's resources going forward, or that may hold a DRA
/// claim rolling back. The operator and `switchyard plan` count with this one function, so the
/// plan shows the order the operator takes.
pub fn consuming_pods(direction: Direction, pods: &[Pod], resources: &[&str]) -> u32 {
    let consumes = |pod: &&Pod| {
        !drain::is_finished(pod)
            && match direction {
                Direction::Forward => drain::consumes_any(pod, resources),
                Direction::Rollback => drain::holds_dra_claim(pod),
            }
    };
    pods.iter().filter(consumes).count() as u32
}

/// Plans one reconcile of `migration`. `nodes` are the nodes its selector selects.
pub fn plan(
    migration: &str,
    spec: &GpuPoolMigrationSpec,
    nodes: &[PoolNode],
    others: &[OtherMigration],
) -> Result<Plan, String> {
    let mut p = Plan::default();
    let mut owned = owned_nodes(migration, nodes, others, &mut p.refused);
    owned.sort_by(|a, b| a.name.cmp(&b.name));
    p.counts.refused = i32::try_from(p.refused.len()).unwrap_or(i32::MAX);
    p.max_unavailable = max_unavailable(&spec.strategy.max_unavailable, owned.len())?;

    let mut candidates = Vec::new();
    for n in &owned {
        p.owned.push(n.name.clone());
        let st = standing(n, spec.direction, spec.strategy.on_failure);
        match st {
            Standing::Done => {}
            Standing::InFlight => p.in_flight.push(n.name.clone()),
            Standing::Candidate => candidates.push(*n),
            Standing::Failed => p.failed.push(n.name.clone()),
        }
        let unavailable = match st {
            Standing::InFlight => true,
            Standing::Failed => n.unschedulable || !n.ready,
            Standing::Done | Standing::Candidate => !n.ready,
        };
        if unavailable {
            p.unavailable += 1;
            p.unavailable_nodes.push(n.name.clone());
        }
        p.counts.total += 1;
        match n.state() {
            NodeState::Migrated | NodeState::Replaced => p.counts.migrated += 1,
            _ if st == Standing::Failed => p.counts.failed += 1,
            NodeState::Failed => p.counts.failed += 1,
            _ if st == Standing::InFlight => p.counts.in_progress += 1,
            _ => p.counts.pending += 1,
        }
    }

    if spec.paused {
        p.halt = Some(Halt::Paused);
    } else if spec.strategy.on_failure == FailurePolicy::Pause
        && let Some(f) = p.failed.first()
    {
        p.halt = Some(Halt::NodeFailed(f.clone()));
    }

    // Nodes already cordoned first: they take no capacity that is not gone already. Then the
    // cheapest.
    candidates.sort_by(|a, b| {
        (!a.unschedulable, a.consuming_pods, &a.name).cmp(&(!b.unschedulable, b.consuming_pods, &b.name))
    });
    let mut unavailable = p.unavailable;
    for c in candidates {
        // A NotReady node cannot drain or switch; it waits until its kubelet is back. Every
        // start takes budget, a node cordoned beforehand too: otherwise a pool an admin cordoned
        // would all start at once.
        let may_start = p.halt.is_none() && c.ready && unavailable < p.max_unavailable;
        if may_start {
            unavailable += 1;
            p.to_start.push(c.name.clone());
        } else {
            p.queued.push(c.name.clone());
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::well_known::*;
    use std::collections::BTreeMap;

    fn spec(max_unavailable: IntOrString) -> GpuPoolMigrationSpec {
        let mut s: GpuPoolMigrationSpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "nvidia-device-plugin"}}
        }))
        .unwrap();
        s.strategy.max_unavailable = max_unavailable;
        s
    }

    #[derive(Clone, Copy)]
    struct N {
        name: &'static str,
        state: Option<&'static str>,
        owner: Option<&'static str>,
        unschedulable: bool,
        ready: bool,
        pods: u32,
        failed_in: Option<&'static str>,
    }

    const fn n(name: &'static str, pods: u32) -> N {
        N { name, state: None, owner: None, unschedulable: false, ready: true, pods, failed_in: None }
    }

    impl N {
        fn state(mut self, s: &'static str) -> Self {
            self.state = Some(s);
            self.owner = Some("pool-a");
            self
        }
        fn owner(mut self, o: &'static str) -> Self {
            self.owner = Some(o);
            self
        }
        fn cordoned(mut self) -> Self {
            self.unschedulable = true;
            self
        }
        fn failed_in_rollback(mut self) -> Self {
            self.failed_in = Some("RollingBack");
            self
        }
        fn not_ready(mut self) -> Self {
            self.ready = false;
            self
        }
        fn build(self) -> PoolNode {
            let mut labels = BTreeMap::from([("pool".to_string(), "a100".to_string())]);
            if let Some(o) = self.owner {
                labels.insert(LABEL_MIGRATION.into(), o.into());
            }
            let mut annotations = BTreeMap::new();
            if let Some(s) = self.state {
                annotations.insert(ANNOTATION_MIGRATION_STATE.to_string(), s.to_string());
            }
            if let Some(state) = self.failed_in {
                let f = format!(r#"{{"state":"{state}","reason":"SwitchTimeout","message":"m"}}"#);
                annotations.insert(ANNOTATION_FAILURE.to_string(), f);
            }
            PoolNode {
                name: self.name.into(),
                labels: labels.into(),
                annotations: annotations.into(),
                unschedulable: self.unschedulable,
                ready: self.ready,
                consuming_pods: self.pods,
            }
        }
    }

    #[test]
    fn max_unavailable_table() {
        let cases = [
            (IntOrString::Int(1), 10, Ok(1)),
            (IntOrString::Int(3), 10, Ok(3)),
            (IntOrString::Int(0), 10, Err(())),
            (IntOrString::String("25%".into()), 10, Ok(2)),
            (IntOrString::String("10%".into()), 5, Ok(1)),
            (IntOrString::String("100%".into()), 7, Ok(7)),
            (IntOrString::String("1%".into()), 0, Ok(1)),
            (IntOrString::String("0%".into()), 10, Err(())),
            (IntOrString::String("101%".into()), 10, Err(())),
            (IntOrString::String("3".into()), 10, Err(())),
        ];
        for (v, pool, want) in cases {
            assert_eq!(max_unavailable(&v, pool).map_err(|_| ()), want, "{v:?} of {pool}");
        }
    }

    #[test]
    fn plan_table() {
        // (name, maxUnavailable, direction, paused, nodes, to_start, in_flight, queued, refused)
        type Case = (
            &'static str,
            IntOrString,
            Direction,
            bool,
            Vec<N>,
            Vec<&'static str>,
            Vec<&'static str>,
            Vec<&'static str>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "cheapest first, one at a time",
                IntOrString::Int(1),
                Direction::Forward,
                false,
                vec![n("c", 2), n("a", 5), n("b", 0)],
                vec!["b"],
                vec![],
                vec!["c", "a"],
                vec![],
            ),
            (
                "ties broken by name",
                IntOrString::Int(2),
                Direction::Forward,
                false,
                vec![n("z", 1), n("y", 1), n("x", 3)],
                vec!["y", "z"],
                vec![],
                vec!["x"],
                vec![],
            ),
            (
                "in-flight node uses the budget",
                IntOrString::Int(1),
                Direction::Forward,
                false,
                vec![n("a", 0).state("Draining"), n("b", 0)],
                vec![],
                vec!["a"],
                vec!["b"],
                vec![],
            ),
            (
                "a migrated node the admin keeps cordoned takes no budget",
                IntOrString::Int(1),
                Direction::Forward,
                false,
                vec![n("a", 0).state("Migrated").cordoned(), n("b", 0), n("c", 1)],
                vec!["b"],
                vec![],
                vec!["c"],
                vec![],
            ),
            (
                "a rolled-back node the admin keeps cordoned takes no budget",
                IntOrString::Int(1),
                Direction::Rollback,
                false,
                vec![n("a", 0).state("RolledBack").cordoned(), n("b", 0).state("Migrated")],
                vec!["b"],
                vec![],
                vec![],
                vec![],
            ),
            (
                "a failed node left cordoned takes budget",
                IntOrString::Int(1),
                Direction::Rollback,
                false,
                vec![n("a", 0).state("Failed").failed_in_rollback().cordoned(), n("b", 0).state("Migrated")],
                vec![],
                vec![],
                vec!["b"],
                vec![],
            ),
            (
                "NotReady node counts and never starts",
                IntOrString::Int(2),
                Direction::Forward,
                false,
                vec![n("a", 0).not_ready(), n("b", 1), n("c", 2)],
                vec!["b"],
                vec![],
                vec!["a", "c"],
                vec![],
            ),
            (
                "an already cordoned candidate goes first",
                IntOrString::Int(1),
                Direction::Forward,
                false,
                vec![n("a", 3).cordoned(), n("b", 0)],
                vec!["a"],
                vec![],
                vec!["b"],
                vec![],
            ),
            (
                "cordoned candidates start within the budget, not all at once",
                IntOrString::Int(2),
                Direction::Forward,
                false,
                vec![n("a", 3).cordoned(), n("b", 0).cordoned(), n("c", 1).cordoned(), n("d", 0)],
                vec!["b", "c"],
                vec![],
                vec!["a", "d"],
                vec![],
            ),
            (
                "percent of pool rounds down, min 1",
                IntOrString::String("50%".into()),
                Direction::Forward,
                false,
                vec![n("a", 0), n("b", 0), n("c", 0)],
                vec!["a"],
                vec![],
                vec!["b", "c"],
                vec![],
            ),
            (
                "paused starts nothing but keeps in-flight",
                IntOrString::Int(3),
                Direction::Forward,
                true,
                vec![n("a", 0).state("Switching"), n("b", 0)],
                vec![],
                vec!["a"],
                vec!["b"],
                vec![],
            ),
            (
                "other migration's node refused",
                IntOrString::Int(3),
                Direction::Forward,
                false,
                vec![n("a", 0).owner("pool-b"), n("b", 0)],
                vec!["b"],
                vec![],
                vec![],
                vec!["a"],
            ),
            (
                "rollback picks migrated nodes, cheapest first",
                IntOrString::Int(1),
                Direction::Rollback,
                false,
                vec![n("a", 4).state("Migrated"), n("b", 1).state("Migrated"), n("c", 0).state("Pending")],
                vec!["b"],
                vec![],
                vec!["a"],
                vec![],
            ),
            (
                "rollback reverses forward in-flight nodes",
                IntOrString::Int(1),
                Direction::Rollback,
                false,
                vec![n("a", 0).state("Verifying"), n("b", 0).state("Migrated")],
                vec![],
                vec!["a"],
                vec!["b"],
                vec![],
            ),
            (
                "a single node starts",
                IntOrString::Int(1),
                Direction::Forward,
                false,
                vec![n("a", 0)],
                vec!["a"],
                vec![],
                vec![],
                vec![],
            ),
        ];
        for (name, mu, direction, paused, nodes, to_start, in_flight, queued, refused) in cases {
            let mut s = spec(mu);
            s.direction = direction;
            s.paused = paused;
            let nodes: Vec<PoolNode> = nodes.into_iter().map(N::build).collect();
            let p = plan("pool-a", &s, &nodes, &[]).unwrap();
            assert_eq!(p.to_start, to_start, "{name}: to_start");
            assert_eq!(p.in_flight, in_flight, "{name}: in_flight");
            assert_eq!(p.queued, queued, "{name}: queued");
            let r: Vec<&str> = p.refused.iter().map(|r| r.node.as_str()).collect();
            assert_eq!(r, refused, "{name}: refused");
        }
    }

    #[test]
    fn dra_label_without_state_is_migrated() {
        let mut node = n("a", 0).build();
        node.labels.insert(LABEL_GPU_BACKEND.into(), BACKEND_DRA.into());
        assert_eq!(node.state(), NodeState::Migrated);
        let p = plan("pool-a", &spec(IntOrString::Int(1)), &[node], &[]).unwrap();
        assert!(p.done());
        assert_eq!(p.counts.migrated, 1);
    }

    #[test]
    fn node_selected_by_two_migrations_is_refused() {
        let other = OtherMigration {
            name: "pool-b".into(),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("pool".into(), "a100".into())])),
                ..Default::default()
            },
        };
        let nodes = vec![n("a", 0).build(), n("b", 0).state("Draining").build()];
        let p = plan("pool-a", &spec(IntOrString::Int(2)), &nodes, &[other]).unwrap();
        // "b" already carries our ownership label, so it stays ours and finishes.
        assert_eq!(p.refused.len(), 1);
        assert_eq!(p.refused[0].node, "a");
        assert!(p.refused[0].message.contains("pool-b"));
        assert_eq!(p.in_flight, vec!["b"]);
    }

    #[test]
    fn failure_with_pause_halts_new_starts() {
        let nodes = vec![n("a", 0).state("Failed").cordoned().build(), n("b", 0).build()];
        let p = plan("pool-a", &spec(IntOrString::Int(3)), &nodes, &[]).unwrap();
        assert_eq!(p.halt, Some(Halt::NodeFailed("a".into())));
        assert!(p.to_start.is_empty());
        assert_eq!(p.failed, vec!["a"]);
        assert_eq!(
            p.counts,
            NodeCounts { total: 2, pending: 1, in_progress: 0, migrated: 0, failed: 1, refused: 0 }
        );

        let mut s = spec(IntOrString::Int(3));
        s.strategy.on_failure = FailurePolicy::Rollback;
        let p = plan("pool-a", &s, &nodes, &[]).unwrap();
        assert_eq!(p.halt, None);
        assert_eq!(p.in_flight, vec!["a"], "a failed node is rolled back under onFailure: Rollback");
        assert_eq!(p.to_start, vec!["b"]);
    }
}
