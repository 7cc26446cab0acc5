//! How many claims the scheduler can allocate one published device to, read from the device as
//! the allocator reads it (KEP-5075, consumable capacity): a device without
//! `allowMultipleAllocations` serves one claim; a shareable one serves as many claims that name no
//! capacity as its scarcest capacity lasts, each taking its request policy's `default` (the whole
//! capacity where there is no policy). Driver-neutral: Switchyard's agent and NVIDIA's DRA driver
//! (`--consumable-shares=<N>`: a `shares` capacity of N, 1 per claim) read the same. Pure.

use k8s_openapi::api::resource::v1::Device;

use crate::quantity::milli_units;

/// What [`claims_per_device`] returns for a device whose capacities never run out: every claim
/// consumes nothing of them (NVIDIA's `--consumable-shares=unlimited`), or it has none.
pub const UNBOUNDED: u64 = u64::MAX;

/// How many claims that name no capacity can share `device` at once: 1 unless it allows multiple
/// allocations; then the fewest, over its capacities, of the capacity's value divided by what one
/// such claim consumes, at least 1. [`UNBOUNDED`] where nothing runs out. A quantity that cannot be
/// read counts as consumed whole (1 claim): never more sharing than the device says.
pub fn claims_per_device(device: &Device) -> u64 {
    if device.allow_multiple_allocations != Some(true) {
        return 1;
    }
    let mut fewest = UNBOUNDED;
    for c in device.capacity.iter().flat_map(|m| m.values()) {
        let value = milli_units(&c.value);
        // With no policy, a claim that names no capacity takes all of it.
        let per_claim = match &c.request_policy {
            Some(p) => p.default.as_ref().and_then(milli_units),
            None => value,
        };
        let claims = match (value, per_claim) {
            (Some(_), Some(0)) => UNBOUNDED,
            (Some(v), Some(per)) if v >= 0 && per > 0 => (v / per).max(1) as u64,
            _ => 1,
        };
        fewest = fewest.min(claims);
    }
    fewest
}

/// `n` claims as a phrase: `2 claims`, `1 claim`, `unbounded claims`.
pub fn describe(n: u64) -> String {
    match n {
        UNBOUNDED => "unbounded claims".into(),
        1 => "1 claim".into(),
        n => format!("{n} claims"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(v: serde_json::Value) -> Device {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn claims_per_device_reads_the_allocator_rules() {
        let shares = |n: &str| {
            serde_json::json!({"value": n, "requestPolicy": {"default": "1",
                "validRange": {"min": "1", "max": n, "step": "1"}}})
        };
        let memory_free = serde_json::json!({"value": "80Gi", "requestPolicy": {"default": "0", "validRange": {"min": "0"}}});
        let cases = [
            ("not shareable", serde_json::json!({"name": "g", "capacity": {"memory": {"value": "80Gi"}}}), 1),
            (
                "shareable, false",
                serde_json::json!({"name": "g", "allowMultipleAllocations": false, "capacity": {"shares": shares("4")}}),
                1,
            ),
            (
                "NVIDIA's --consumable-shares=2",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true,
                    "capacity": {"shares": shares("2"), "memory": memory_free}}),
                2,
            ),
            (
                "NVIDIA's --consumable-shares=unlimited",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true, "capacity": {"memory": memory_free}}),
                UNBOUNDED,
            ),
            (
                "NVIDIA's --consumable-shares=memory: each claim takes all of it",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true,
                    "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi"}}}}),
                1,
            ),
            (
                "a capacity without a policy is consumed whole",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true,
                    "capacity": {"shares": shares("4"), "memory": {"value": "80Gi"}}}),
                1,
            ),
            (
                "the scarcest capacity decides",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true, "capacity": {
                    "shares": shares("8"),
                    "memory": {"value": "40Gi", "requestPolicy": {"default": "10Gi"}}}}),
                4,
            ),
            (
                "an unreadable quantity shares nothing",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true, "capacity": {"shares": shares("lots")}}),
                1,
            ),
            (
                "no capacity at all",
                serde_json::json!({"name": "g", "allowMultipleAllocations": true}),
                UNBOUNDED,
            ),
        ];
        for (case, d, want) in cases {
            assert_eq!(claims_per_device(&device(d)), want, "{case}");
        }
    }

    #[test]
    fn described() {
        assert_eq!(
            [describe(1), describe(2), describe(UNBOUNDED)],
            ["1 claim", "2 claims", "unbounded claims"]
        );
    }
}
