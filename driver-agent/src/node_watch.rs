//! The agent's own Node, watched once for everything the agent reads from it: whether the node
//! still advertises the device plugin's GPUs (the [`crate::coexistence`] interlock), and how many
//! claims may share each device the agent publishes there (the
//! [`well_known::LABEL_GPU_SHARES`] label, over `--shares-per-device`).
//!
//! The label is read whether or not the interlock is on. Until the Node is first seen, the flag's
//! value holds; a label that is not a positive integer is named in a warning and the flag's value
//! holds too.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, Client};
use switchyard_api::well_known;
use tokio::sync::watch;

use crate::coexistence::{Guard, Interlock};

/// The node's [`well_known::LABEL_GPU_SHARES`] label, as the agent reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharesLabel {
    /// The node has no such label.
    Absent,
    /// A positive integer: the claims that may share each device on this node.
    Valid(u32),
    /// Any other value, kept to be named in the warning.
    Invalid(String),
}

impl SharesLabel {
    /// The label on `node`. Pure.
    pub fn of(node: &Node) -> Self {
        match node.metadata.labels.as_ref().and_then(|l| l.get(well_known::LABEL_GPU_SHARES)) {
            None => SharesLabel::Absent,
            Some(v) => match v.parse::<u32>() {
                Ok(n) if n > 0 => SharesLabel::Valid(n),
                _ => SharesLabel::Invalid(v.clone()),
            },
        }
    }

    /// The shares per device the agent publishes: the label's value where it is valid, else
    /// `flag` (`--shares-per-device`).
    pub fn or(&self, flag: u32) -> u32 {
        match self {
            SharesLabel::Valid(n) => *n,
            SharesLabel::Absent | SharesLabel::Invalid(_) => flag,
        }
    }
}

/// How many claims may share each device, as the agent loop reads it (see
/// `slices::build_devices`).
#[derive(Clone, Debug)]
pub struct SharesPerDevice {
    rx: watch::Receiver<u32>,
}

impl SharesPerDevice {
    /// Always `n`: no Node to read a label from (`--dry-run`, tests).
    pub fn fixed(n: u32) -> Self {
        Self::channel(n).1
    }

    /// A value set through the returned sender, for tests.
    pub fn channel(n: u32) -> (watch::Sender<u32>, Self) {
        let (tx, rx) = watch::channel(n);
        (tx, SharesPerDevice { rx })
    }

    pub fn get(&self) -> u32 {
        *self.rx.borrow()
    }

    /// Waits for the next change; forever once nothing can change it.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The watching side of [`SharesPerDevice`].
struct SharesFeed {
    tx: watch::Sender<u32>,
    /// `--shares-per-device`.
    flag: u32,
    /// The invalid label value last warned about, so that each Node update does not warn again.
    warned: Option<String>,
}

impl SharesFeed {
    fn observe(&mut self, node: &Node) {
        let label = SharesLabel::of(node);
        let invalid = match &label {
            SharesLabel::Invalid(v) => Some(v.clone()),
            SharesLabel::Absent | SharesLabel::Valid(_) => None,
        };
        if let Some(v) = &invalid
            && self.warned.as_ref() != Some(v)
        {
            tracing::warn!(
                label = well_known::LABEL_GPU_SHARES,
                value = %v,
                shares_per_device = self.flag,
                "the node's label is not a positive integer; using --shares-per-device"
            );
        }
        self.warned = invalid;
        let n = label.or(self.flag);
        let changed = self.tx.send_if_modified(|current| {
            let changed = *current != n;
            *current = n;
            changed
        });
        if changed {
            tracing::info!(
                shares_per_device = n,
                from_label = matches!(label, SharesLabel::Valid(_)),
                "claims per device changed; publishing the devices again"
            );
        }
    }
}

/// Watches `node` and keeps both readers current: the interlock on the device plugin's
/// resources `patterns` (off when empty: the guard never reports the device plugin), and the
/// shares per device (`flag` until the Node is first seen). One watch, one connection per agent.
pub fn watch(client: Client, node: String, patterns: Vec<String>, flag: u32) -> (Guard, SharesPerDevice) {
    let (interlock, guard) = match patterns.is_empty() {
        true => (None, Guard::disabled()),
        false => {
            let (interlock, guard) = Interlock::new(patterns);
            (Some(interlock), guard)
        }
    };
    let (tx, shares) = SharesPerDevice::channel(flag);
    let mut feed = SharesFeed { tx, flag, warned: None };
    tokio::spawn(async move {
        let api: Api<Node> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
        // Its own short backoff: without one, a failing watch retries in a tight loop.
        let mut stream = switchyard_api::watch::backed_off(watcher(api, config)).boxed();
        while let Some(event) = stream.next().await {
            let n = match event {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "watching the Node failed; the watcher retries");
                    continue;
                }
            };
            if let Some(i) = &interlock {
                i.observe(&n);
            }
            feed.observe(&n);
            if feed.tx.is_closed() && interlock.as_ref().is_none_or(Interlock::is_closed) {
                return;
            }
        }
    });
    (guard, shares)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(label: Option<&str>) -> Node {
        let mut n: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        if let Some(v) = label {
            n.metadata.labels = Some([(well_known::LABEL_GPU_SHARES.to_string(), v.to_string())].into());
        }
        n
    }

    #[test]
    fn the_label_overrides_the_flag_only_with_a_positive_integer() {
        let cases = [
            (None, SharesLabel::Absent, 2),
            (Some("4"), SharesLabel::Valid(4), 4),
            (Some("1"), SharesLabel::Valid(1), 1),
            (Some("0"), SharesLabel::Invalid("0".into()), 2),
            (Some("-3"), SharesLabel::Invalid("-3".into()), 2),
            (Some("two"), SharesLabel::Invalid("two".into()), 2),
            (Some("1.5"), SharesLabel::Invalid("1.5".into()), 2),
            (Some(""), SharesLabel::Invalid(String::new()), 2),
            (Some("99999999999"), SharesLabel::Invalid("99999999999".into()), 2),
        ];
        for (label, want, shares) in cases {
            let got = SharesLabel::of(&node(label));
            assert_eq!(got, want, "{label:?}");
            assert_eq!(got.or(2), shares, "{label:?} over --shares-per-device=2");
        }
    }

    /// Each observation sets the value the loop reads; only a real change wakes the loop.
    #[tokio::test]
    async fn observations_change_the_shares_only_when_the_value_changes() {
        let (tx, mut shares) = SharesPerDevice::channel(2);
        let mut feed = SharesFeed { tx, flag: 2, warned: None };
        // Whether the loop's `changed()` would wake, and the change then seen.
        let woke = |shares: &mut SharesPerDevice| {
            let changed = shares.rx.has_changed().unwrap();
            shares.rx.borrow_and_update();
            changed
        };
        feed.observe(&node(None));
        assert_eq!((shares.get(), woke(&mut shares)), (2, false), "no label: the flag, no change");
        feed.observe(&node(Some("8")));
        assert_eq!((shares.get(), woke(&mut shares)), (8, true));
        feed.observe(&node(Some("8")));
        assert!(!woke(&mut shares), "the same value again");
        feed.observe(&node(Some("lots")));
        assert_eq!((shares.get(), woke(&mut shares)), (2, true), "invalid: back to the flag");
        assert_eq!(feed.warned.as_deref(), Some("lots"));
        feed.observe(&node(None));
        assert_eq!((shares.get(), woke(&mut shares), feed.warned.as_deref()), (2, false, None));
    }
}
