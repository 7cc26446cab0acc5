//! Node labels and annotations as the caches keep them: [`StrMap`], a small immutable map of
//! interned strings, and [`LabelQuery`], a label selector that reads it.
//!
//! The node cache holds every node of the cluster. In a `BTreeMap<String, String>` each label
//! costs two allocations, and the map at least one B-tree leaf of eleven slots (about 550 bytes,
//! 640 as allocated) even for one label. The keys repeat on every node, and most values too (the
//! GPU product, the driver version, the pool name), yet each node held its own copies. A GPU node
//! carries tens of labels (GPU Feature Discovery's `nvidia.com/*`, Node Feature Discovery's
//! `feature.node.kubernetes.io/*`), so that was kilobytes per node, and a reconcile copied every
//! map again for each node of the pool. A [`StrMap`] is one shared slice of pairs that point into
//! one table of strings: cloning it is a reference count, and a label costs 32 bytes.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use kube::core::{Expression, Selector};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The interning table: one copy of every label key and value (and annotation) the caches hold.
///
/// Strings stay while some map holds them. A node's own values (its hostname) go with the node:
/// once the table has doubled since its last sweep, it drops the strings nothing else holds, so
/// node churn cannot grow it without bound and the sweeps cost O(1) a string.
struct Table {
    strings: HashSet<Entry>,
    sweep_at: usize,
}

/// The smallest table that is swept.
const MIN_SWEEP: usize = 4096;

/// An interned string, hashed and compared by its text so the table finds it by `&str`.
struct Entry(Arc<str>);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        *self.0 == *other.0
    }
}

impl Eq for Entry {}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}

impl Borrow<str> for Entry {
    fn borrow(&self) -> &str {
        &self.0
    }
}

static TABLE: LazyLock<Mutex<Table>> =
    LazyLock::new(|| Mutex::new(Table { strings: HashSet::new(), sweep_at: MIN_SWEEP }));

/// The shared copy of `s`.
pub fn intern(s: &str) -> Arc<str> {
    // Every update leaves the set consistent, so a panic elsewhere cannot have broken it.
    let mut t = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(e) = t.strings.get(s) {
        return e.0.clone();
    }
    if t.strings.len() >= t.sweep_at {
        t.strings.retain(|e| Arc::strong_count(&e.0) > 1);
        t.sweep_at = (t.strings.len() * 2).max(MIN_SWEEP);
    }
    let e: Arc<str> = Arc::from(s);
    t.strings.insert(Entry(e.clone()));
    e
}

/// How many strings the table holds (for tests and the footprint example).
pub fn interned() -> usize {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner).strings.len()
}

/// An immutable string map: sorted pairs of interned strings behind one reference count. Empty
/// costs nothing. Read with [`StrMap::get`]; built from a map or pairs, or by
/// [`StrMap::insert`], which copies (maps are small and written rarely: once per watch event).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StrMap(Option<Arc<[Pair]>>);

/// A key and its value, both interned.
type Pair = (Arc<str>, Arc<str>);

impl StrMap {
    fn pairs(&self) -> &[Pair] {
        self.0.as_deref().unwrap_or_default()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let pairs = self.pairs();
        pairs.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*pairs[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The pairs, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs().iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.pairs().len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs().is_empty()
    }

    /// Sets `key` to `value` (a copy of the map with it).
    pub fn insert(&mut self, key: String, value: String) {
        let mut pairs: Vec<Pair> = self.pairs().to_vec();
        match pairs.binary_search_by(|(k, _)| (**k).cmp(&key)) {
            Ok(i) => pairs[i].1 = intern(&value),
            Err(i) => pairs.insert(i, (intern(&key), intern(&value))),
        }
        *self = StrMap::sorted(pairs);
    }

    /// Whether `self` and `other` are the same map in memory, not only equal: a clone is.
    pub fn is_shared_with(&self, other: &StrMap) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }

    /// The map as a `BTreeMap`, for what takes one.
    pub fn to_btree(&self) -> BTreeMap<String, String> {
        self.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// `pairs` sorted by key and without duplicate keys (the last wins).
    fn sorted(pairs: Vec<Pair>) -> Self {
        if pairs.is_empty() {
            return StrMap(None);
        }
        StrMap(Some(pairs.into()))
    }

    fn from_pairs(mut pairs: Vec<Pair>) -> Self {
        // Stable, so among equal keys the last read stays last; then keep that one.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<Pair> = Vec::with_capacity(pairs.len());
        for p in pairs {
            match out.last_mut() {
                Some(last) if last.0 == p.0 => *last = p,
                _ => out.push(p),
            }
        }
        StrMap::sorted(out)
    }

    /// Reads a JSON map of strings (or `null`), keeping the pairs whose key `keep` accepts; the
    /// values of the others are skipped unread.
    pub fn deserialize_filtered<'de, D: Deserializer<'de>>(
        d: D,
        keep: fn(&str) -> bool,
    ) -> Result<StrMap, D::Error> {
        struct Pairs(fn(&str) -> bool);
        impl<'de> Visitor<'de> for Pairs {
            type Value = StrMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings or null")
            }
            fn visit_none<E>(self) -> Result<StrMap, E> {
                Ok(StrMap::default())
            }
            fn visit_unit<E>(self) -> Result<StrMap, E> {
                Ok(StrMap::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<StrMap, D::Error> {
                d.deserialize_map(self)
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<StrMap, M::Error> {
                let mut pairs = Vec::with_capacity(m.size_hint().unwrap_or(0));
                while let Some(Interned(k)) = m.next_key::<Interned>()? {
                    if (self.0)(&k) {
                        let Interned(v) = m.next_value::<Interned>()?;
                        pairs.push((k, v));
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(StrMap::from_pairs(pairs))
            }
        }
        d.deserialize_option(Pairs(keep))
    }
}

impl<'de> Deserialize<'de> for StrMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StrMap::deserialize_filtered(d, |_| true)
    }
}

/// A string read straight into the table: a borrowed key or value is not copied first.
struct Interned(Arc<str>);

impl<'de> Deserialize<'de> for Interned {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Interned;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, s: &str) -> Result<Interned, E> {
                Ok(Interned(intern(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for StrMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        StrMap::from_pairs(iter.into_iter().map(|(k, v)| (intern(k.as_ref()), intern(v.as_ref()))).collect())
    }
}

impl From<BTreeMap<String, String>> for StrMap {
    fn from(m: BTreeMap<String, String>) -> Self {
        m.iter().collect()
    }
}

impl fmt::Debug for StrMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Label lookup, for what reads a label set in either form.
pub trait Labels {
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for StrMap {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// A label selector, read once, that matches any [`Labels`] with kube's semantics
/// (`Selector::matches`): kube's only matches a `BTreeMap`.
#[derive(Clone, Debug, Default)]
pub struct LabelQuery(Vec<Expression>);

impl LabelQuery {
    pub fn matches(&self, labels: &impl Labels) -> bool {
        self.0.iter().all(|e| holds(e, labels))
    }

    /// Whether every requirement holds, or names a key `lost` accepts that `labels` lacks
    /// altogether: a label that went, never one whose value changed.
    pub fn matches_but_lost(&self, labels: &impl Labels, lost: impl Fn(&str) -> bool) -> bool {
        self.0.iter().all(|e| holds(e, labels) || (lost(key(e)) && labels.label(key(e)).is_none()))
    }
}

fn holds(e: &Expression, labels: &impl Labels) -> bool {
    match e {
        Expression::In(k, values) => labels.label(k).is_some_and(|v| values.contains(v)),
        Expression::NotIn(k, values) => labels.label(k).is_none_or(|v| !values.contains(v)),
        Expression::Exists(k) => labels.label(k).is_some(),
        Expression::DoesNotExist(k) => labels.label(k).is_none(),
        Expression::Equal(k, value) => labels.label(k) == Some(value.as_str()),
        Expression::NotEqual(k, value) => labels.label(k) != Some(value.as_str()),
    }
}

fn key(e: &Expression) -> &str {
    match e {
        Expression::In(k, _)
        | Expression::NotIn(k, _)
        | Expression::Exists(k)
        | Expression::DoesNotExist(k)
        | Expression::Equal(k, _)
        | Expression::NotEqual(k, _) => k,
    }
}

impl From<&Selector> for LabelQuery {
    fn from(s: &Selector) -> Self {
        LabelQuery(s.clone().into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::core::SelectorExt;
    use serde_json::json;

    fn btree(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_map_reads_like_the_btree_it_was_made_from() {
        let b = btree(&[("pool", "h100"), ("nvidia.com/gpu.count", "8"), ("a", "")]);
        let m = StrMap::from(b.clone());
        assert_eq!(m.len(), 3);
        assert_eq!(m.get("pool"), Some("h100"));
        assert_eq!(m.get("a"), Some(""));
        assert_eq!(m.get("missing"), None);
        assert!(m.contains_key("nvidia.com/gpu.count") && !m.contains_key("nvidia.com"));
        assert_eq!(m.to_btree(), b);
        assert_eq!(m.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["a", "nvidia.com/gpu.count", "pool"]);
        assert_eq!(format!("{m:?}"), format!("{b:?}"));
        assert!(StrMap::default().is_empty() && StrMap::default().get("a").is_none());
        assert_eq!(StrMap::from(BTreeMap::new()), StrMap::default());
    }

    #[test]
    fn insert_sets_or_adds_and_leaves_the_copies_as_they_were() {
        let mut m = StrMap::from(btree(&[("b", "1")]));
        let before = m.clone();
        m.insert("a".into(), "0".into());
        m.insert("b".into(), "2".into());
        m.insert("c".into(), "3".into());
        assert_eq!(m.to_btree(), btree(&[("a", "0"), ("b", "2"), ("c", "3")]));
        assert_eq!(before.to_btree(), btree(&[("b", "1")]));
    }

    #[test]
    fn equal_strings_are_shared_between_maps() {
        let a = StrMap::from(btree(&[("str-map-test/shared-key", "str-map-test/shared-value")]));
        let b: StrMap =
            serde_json::from_value(json!({"str-map-test/shared-key": "str-map-test/shared-value"})).unwrap();
        let (ka, va) = &a.pairs()[0];
        let (kb, vb) = &b.pairs()[0];
        assert!(Arc::ptr_eq(ka, kb) && Arc::ptr_eq(va, vb));
    }

    #[test]
    fn json_reads_into_a_map_filtered_and_with_the_last_duplicate() {
        let m: StrMap = serde_json::from_str(r#"{"z": "1", "a": "2", "z": "3"}"#).unwrap();
        assert_eq!(m.to_btree(), btree(&[("a", "2"), ("z", "3")]));
        let null: StrMap = serde_json::from_value(json!(null)).unwrap();
        assert!(null.is_empty());
        assert!(serde_json::from_value::<StrMap>(json!({"a": 1})).is_err(), "values are strings");
        let mut de =
            serde_json::Deserializer::from_str(r#"{"keep/a": "1", "other": {"nested": [1]}, "keep/b": "2"}"#);
        let kept = StrMap::deserialize_filtered(&mut de, |k| k.starts_with("keep/")).unwrap();
        assert_eq!(kept.to_btree(), btree(&[("keep/a", "1"), ("keep/b", "2")]));
    }

    #[test]
    fn strings_no_map_holds_are_swept_once_the_table_has_doubled() {
        // Other tests intern too, in parallel: judge only this test's strings.
        let mine = |i: usize| format!("str-map-test/swept-{i}");
        let kept = StrMap::from_iter([(mine(0), "v")]);
        // More than any sweep threshold: the table sweeps at least once meanwhile.
        for i in 1..=3 * MIN_SWEEP {
            drop(intern(&mine(i)));
        }
        let held = |i: usize| TABLE.lock().unwrap().strings.contains(mine(i).as_str());
        let swept = (1..=MIN_SWEEP).filter(|&i| !held(i)).count();
        assert!(swept >= MIN_SWEEP / 2, "only {swept} of the first {MIN_SWEEP} dropped strings swept");
        assert!(held(0), "a string a map holds stays");
        assert_eq!(kept.get(&mine(0)), Some("v"));
        assert!(interned() >= 1);
    }

    #[test]
    fn a_query_matches_as_kubes_selector_does() {
        let selectors = [
            json!({}),
            json!({"matchLabels": {"pool": "h100"}}),
            json!({"matchLabels": {"pool": "h100", "zone": "a"}}),
            json!({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100", "a100"]}]}),
            json!({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a100"]}]}),
            json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}),
            json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
            json!({"matchLabels": {"pool": "h100"},
                   "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}),
        ];
        let label_sets = [
            btree(&[]),
            btree(&[("pool", "h100")]),
            btree(&[("pool", "a100")]),
            btree(&[("pool", "h100"), ("zone", "a")]),
            btree(&[("pool", "h100"), ("zone", "b")]),
            btree(&[("zone", "a")]),
        ];
        let mut matched = 0;
        for s in &selectors {
            let ls: LabelSelector = serde_json::from_value(s.clone()).unwrap();
            let selector = Selector::try_from(ls).unwrap();
            let query = LabelQuery::from(&selector);
            for labels in &label_sets {
                let want = selector.matches(labels);
                assert_eq!(query.matches(&StrMap::from(labels.clone())), want, "{s} on {labels:?}");
                assert_eq!(query.matches(labels), want, "{s} on {labels:?} as a BTreeMap");
                matched += usize::from(want);
            }
        }
        // Both outcomes occur, so the comparison above tells a matcher from a constant.
        assert!(matched > 0 && matched < selectors.len() * label_sets.len());
    }
}
