//! Leader election on a coordination.k8s.io/v1 Lease, so that only one replica moves nodes. The
//! decision is pure ([`decide`]); [`Elector`] does the get/create/replace with optimistic
//! concurrency (a conflict means another replica won the race).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};

/// How long a lease is valid without renewal: a crashed leader's successor waits this long.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the leader renews: a third of the duration leaves two retries before it expires.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// A leader that has not renewed for this long stops acting, before its lease (15 s) can expire
/// and a standby take over: the gap keeps two leaders from ever writing at once.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// What to do with the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No lease yet: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Someone else held it and it expired (or was released): take it.
    TakeOver,
    /// Someone else holds a live lease.
    Wait,
}

/// Decides from the current lease. Pure.
pub fn decide(lease: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease else {
        return Decision::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None | Some("") => Decision::TakeOver,
        Some(_) => {
            let duration = spec.lease_duration_seconds.unwrap_or(LEASE_DURATION.as_secs() as i32) as i64;
            let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0.as_second());
            match renewed {
                Some(r) if now.as_second() <= r + duration => Decision::Wait,
                _ => Decision::TakeOver,
            }
        }
    }
}

/// The lease spec after a successful Create, Renew or TakeOver. Pure.
pub fn next_spec(old: Option<&LeaseSpec>, decision: Decision, identity: &str, now: Timestamp) -> LeaseSpec {
    let mut spec = old.cloned().unwrap_or_default();
    spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
    spec.renew_time = Some(MicroTime(now));
    if decision != Decision::Renew {
        spec.holder_identity = Some(identity.to_string());
        spec.acquire_time = Some(MicroTime(now));
        if decision == Decision::TakeOver {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
    }
    spec
}

/// Holds or waits for one Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
}

impl Elector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into() }
    }

    /// One round: true when we hold the lease afterwards.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let decision = decide(spec, &self.identity, Timestamp::now());
        if decision == Decision::Wait {
            return Ok(false);
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: current.as_ref().and_then(|l| l.metadata.resource_version.clone()),
                ..current.as_ref().map(|l| l.metadata.clone()).unwrap_or_default()
            },
            spec: Some(next_spec(spec, decision, &self.identity, Timestamp::now())),
        };
        let res = if decision == Decision::Create {
            self.api.create(&PostParams::default(), &lease).await
        } else {
            self.api.replace(&self.name, &PostParams::default(), &lease).await
        };
        match res {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up on shutdown so a successor does not wait for it to expire.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let holds =
            lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.identity.as_str());
        if !holds {
            return Ok(());
        }
        if let Some(s) = lease.spec.as_mut() {
            s.holder_identity = None;
        }
        self.api.replace(&self.name, &PostParams::default(), &lease).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(String::from),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            ..Default::default()
        }
    }

    #[test]
    fn decide_table() {
        let cases = [
            (None, 100, Decision::Create),
            (Some(lease(Some("me"), 0)), 100, Decision::Renew),
            (Some(lease(Some("other"), 90)), 100, Decision::Wait),
            (Some(lease(Some("other"), 85)), 100, Decision::Wait),
            (Some(lease(Some("other"), 84)), 100, Decision::TakeOver),
            (Some(lease(None, 99)), 100, Decision::TakeOver),
            (Some(lease(Some(""), 99)), 100, Decision::TakeOver),
        ];
        for (l, now, want) in cases {
            assert_eq!(decide(l.as_ref(), "me", at(now)), want, "{l:?}");
        }
    }

    #[test]
    fn takeover_counts_transitions() {
        let old = lease(Some("other"), 0);
        let s = next_spec(Some(&old), Decision::TakeOver, "me", at(100));
        assert_eq!(s.holder_identity.as_deref(), Some("me"));
        assert_eq!(s.lease_transitions, Some(1));
        assert_eq!(s.renew_time, Some(MicroTime(at(100))));
        let renewed = next_spec(Some(&s), Decision::Renew, "me", at(105));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(100))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(105))));
        assert_eq!(renewed.lease_transitions, Some(1));
    }
}
