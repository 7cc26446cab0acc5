//! Events (`events.k8s.io/v1`), published as the events API aggregates them, in bounded memory.
//!
//! The same event again (same object, reason, related object and note) within
//! [`SERIES_WINDOW`] becomes a series on the first one: a merge patch of `series.count` and
//! `series.lastObservedTime`, not a new object. A new note is a new event, so a changed message
//! (a different PDB blocking a drain, say) shows, where kube-runtime's `Recorder` folds it into
//! the first event's series and keeps the first note. Only what a series needs is remembered
//! (the event's name and count), at most [`REMEMBERED`] events: a migration of 5,000 nodes
//! publishes some 20,000 events, and the `Recorder` keeps each whole one for six minutes.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;

/// How long a repeat joins the first event's series: the `Recorder`'s window, six minutes.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Events remembered for series at most; the oldest are forgotten first (a repeat of a forgotten
/// event is a new event, which is what the API would show after its own TTL anyway).
pub const REMEMBERED: usize = 4096;
/// The events API's limit on a note, in bytes; longer notes are refused.
pub const NOTE_MAX: usize = 1024;

/// One event to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub type_: EventType,
    pub reason: String,
    pub action: String,
    pub note: String,
    /// The second object the event is about (the migration for a node's event, or a node).
    pub related: Option<ObjectReference>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    regarding: (Option<String>, Option<String>, Option<String>),
    reason: String,
    related: Option<String>,
    note: u64,
}

struct Remembered {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

/// Publishes events for one reporting controller.
pub struct Publisher {
    client: kube::Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    by_key: HashMap<Key, Remembered>,
    order: VecDeque<Key>,
}

impl Recent {
    /// The remembered event for `key` still in its window, with its count raised; `None` when
    /// `key` starts a new event.
    fn repeat(&mut self, key: &Key, now: Instant) -> Option<(String, String, i32)> {
        let r = self.by_key.get_mut(key).filter(|r| now.duration_since(r.at) < SERIES_WINDOW)?;
        r.count += 1;
        r.at = now;
        Some((r.namespace.clone(), r.name.clone(), r.count))
    }

    fn remember(&mut self, key: Key, namespace: String, name: String, now: Instant) {
        if self.by_key.insert(key.clone(), Remembered { namespace, name, count: 1, at: now }).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
    }
}

/// `note` cut to the events API's limit on a char boundary.
pub fn cut_note(note: &str) -> String {
    if note.len() <= NOTE_MAX {
        return note.to_string();
    }
    let mut cut = NOTE_MAX - 3;
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &note[..cut])
}

fn key(regarding: &ObjectReference, ev: &Event) -> Key {
    let mut h = DefaultHasher::new();
    ev.note.hash(&mut h);
    Key {
        regarding: (regarding.kind.clone(), regarding.namespace.clone(), regarding.name.clone()),
        reason: ev.reason.clone(),
        related: ev.related.as_ref().and_then(|r| r.name.clone()),
        note: h.finish(),
    }
}

/// The Event object for a new event. Pure.
pub fn body(
    regarding: &ObjectReference,
    ev: &Event,
    controller: &str,
    instance: &str,
    now: Timestamp,
) -> K8sEvent {
    K8sEvent {
        metadata: ObjectMeta {
            // As client-go names events: the object's name and a unique suffix.
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or("event"),
                now.as_nanosecond() as u64 ^ (std::process::id() as u64) << 40
            )),
            namespace: Some(regarding.namespace.clone().unwrap_or_else(|| "default".into())),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(ev.action.clone()),
        reason: Some(ev.reason.clone()),
        note: Some(cut_note(&ev.note)),
        type_: Some(match ev.type_ {
            EventType::Normal => "Normal".into(),
            EventType::Warning => "Warning".into(),
        }),
        regarding: Some(regarding.clone()),
        related: ev.related.clone(),
        reporting_controller: Some(controller.to_string()),
        reporting_instance: Some(instance.to_string()),
        ..Default::default()
    }
}

impl Publisher {
    pub fn new(client: kube::Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            recent: Mutex::new(Recent::default()),
        }
    }

    /// Publishes `ev` about `regarding`: a new Event, or a series update of the same one.
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let k = key(regarding, ev);
        let now = Instant::now();
        let repeat = self.recent.lock().ok().and_then(|mut r| r.repeat(&k, now));
        if let Some((namespace, name, count)) = repeat {
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
            let series = serde_json::json!({"series": EventSeries {
                count,
                last_observed_time: MicroTime(Timestamp::now()),
            }});
            return match api.patch(&name, &PatchParams::default(), &Patch::Merge(&series)).await {
                Ok(_) => Ok(()),
                // Gone (the API's own TTL): start again.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    if let Ok(mut r) = self.recent.lock() {
                        r.by_key.remove(&k);
                    }
                    Box::pin(self.publish(ev, regarding)).await
                }
                Err(e) => Err(e),
            };
        }
        let event = body(regarding, ev, &self.controller, &self.instance, Timestamp::now());
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.metadata.name.clone().unwrap_or_default();
        Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await?;
        if let Ok(mut r) = self.recent.lock() {
            r.remember(k, namespace, name, now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn ev(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: reason.into(),
            action: "MigrateNode".into(),
            note: note.into(),
            related: None,
        }
    }

    #[test]
    fn a_repeat_joins_the_series_and_a_new_note_is_a_new_event() {
        let mut r = Recent::default();
        let t = Instant::now();
        let first = key(&node("n1"), &ev("EvictionBlocked", "pdb a"));
        assert_eq!(r.repeat(&first, t), None);
        r.remember(first.clone(), "default".into(), "n1.1".into(), t);
        assert_eq!(r.repeat(&first, t + Duration::from_secs(1)), Some(("default".into(), "n1.1".into(), 2)));
        assert_eq!(r.repeat(&first, t + Duration::from_secs(2)), Some(("default".into(), "n1.1".into(), 3)));
        // Another note, another node, another reason: new events.
        assert_eq!(r.repeat(&key(&node("n1"), &ev("EvictionBlocked", "pdb b")), t), None);
        assert_eq!(r.repeat(&key(&node("n2"), &ev("EvictionBlocked", "pdb a")), t), None);
        assert_eq!(r.repeat(&key(&node("n1"), &ev("DrainTimeout", "pdb a")), t), None);
        // After the window: a new event.
        assert_eq!(r.repeat(&first, t + Duration::from_secs(2) + SERIES_WINDOW), None);
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_are_forgotten() {
        let mut r = Recent::default();
        let t = Instant::now();
        for i in 0..REMEMBERED + 10 {
            r.remember(
                key(&node(&format!("n{i}")), &ev("NodeDraining", "x")),
                "default".into(),
                format!("e{i}"),
                t,
            );
        }
        assert_eq!((r.by_key.len(), r.order.len()), (REMEMBERED, REMEMBERED));
        assert_eq!(r.repeat(&key(&node("n0"), &ev("NodeDraining", "x")), t), None, "the oldest went first");
        assert!(
            r.repeat(&key(&node(&format!("n{}", REMEMBERED + 9)), &ev("NodeDraining", "x")), t).is_some()
        );
    }

    #[test]
    fn the_body_names_both_objects_and_cuts_the_note() {
        let gpm = ObjectReference {
            kind: Some("GpuPoolMigration".into()),
            name: Some("pool".into()),
            ..Default::default()
        };
        let e = Event { related: Some(gpm.clone()), note: "é".repeat(600), ..ev("NodeDraining", "") };
        let b = body(&node("n1"), &e, "switchyard-operator", "pod-1", Timestamp::from_second(1).unwrap());
        assert_eq!(
            b.metadata.namespace.as_deref(),
            Some("default"),
            "cluster-scoped objects' events go to default"
        );
        assert!(b.metadata.name.as_deref().unwrap().starts_with("n1."));
        assert_eq!(b.related, Some(gpm));
        assert_eq!(b.reporting_controller.as_deref(), Some("switchyard-operator"));
        let note = b.note.unwrap();
        assert!(note.len() <= NOTE_MAX && note.ends_with("..."), "{}", note.len());
    }
}
