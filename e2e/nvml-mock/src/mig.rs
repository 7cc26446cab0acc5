//! The MIG geometry the mock answers for a GPU in MIG mode: an H100 80GB's GPU instance profiles
//! (`nvidia-smi mig -lgip`) and their possible placements (`nvidia-smi mig -lgipp`), and where an
//! inventory's instances sit on their GPU.
//!
//! A placement is a start and a size in memory slices (an H100 has 8); a profile's `size` can
//! exceed its compute slices (`1g.20gb` takes one compute slice and two memory slices). Instances
//! on one GPU never share a memory slice, and a profile has at most `instances` of them.

use crate::inventory::{Gpu, Mig};

/// One GPU instance profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// NVML's profile index, `NVML_GPU_INSTANCE_PROFILE_*` (what `GetGpuInstanceProfileInfo` takes).
    pub index: u32,
    /// The profile's id on the device (what `GetGpuInstancePossiblePlacements` and
    /// `GetGpuInstances` take, and a GPU instance's info names).
    pub id: u32,
    /// `1g.10gb`, `1g.10gb+me`.
    pub name: &'static str,
    /// Compute slices: the compute instance profile that spans the instance has as many.
    pub slices: u32,
    /// How many instances of the profile fit on the GPU at once.
    pub instances: u32,
    pub memory_mb: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    /// Memory slices of one placement.
    pub size: u32,
    /// The memory slices a placement may start at, in NVML's order.
    pub starts: &'static [u32],
}

/// An H100 80GB HBM3's GPU instance profiles, by index. The indexes not listed
/// (`NVML_GPU_INSTANCE_PROFILE_8_SLICE`, `_6_SLICE`, `_2_SLICE_REV1` and the Blackwell ones from
/// 10 on) are not supported on it.
pub const H100_80GB: [Profile; 7] = [
    Profile {
        index: 0,
        id: 19,
        name: "1g.10gb",
        slices: 1,
        instances: 7,
        memory_mb: 9984,
        multiprocessors: 16,
        copy_engines: 1,
        decoders: 1,
        jpegs: 1,
        ofas: 0,
        size: 1,
        starts: &[0, 1, 2, 3, 4, 5, 6],
    },
    Profile {
        index: 1,
        id: 14,
        name: "2g.20gb",
        slices: 2,
        instances: 3,
        memory_mb: 20096,
        multiprocessors: 32,
        copy_engines: 2,
        decoders: 2,
        jpegs: 2,
        ofas: 0,
        size: 2,
        starts: &[0, 2, 4],
    },
    Profile {
        index: 2,
        id: 9,
        name: "3g.40gb",
        slices: 3,
        instances: 2,
        memory_mb: 40448,
        multiprocessors: 60,
        copy_engines: 3,
        decoders: 3,
        jpegs: 3,
        ofas: 0,
        size: 4,
        starts: &[0, 4],
    },
    Profile {
        index: 3,
        id: 5,
        name: "4g.40gb",
        slices: 4,
        instances: 1,
        memory_mb: 40448,
        multiprocessors: 64,
        copy_engines: 4,
        decoders: 4,
        jpegs: 4,
        ofas: 0,
        size: 4,
        starts: &[0],
    },
    Profile {
        index: 4,
        id: 0,
        name: "7g.80gb",
        slices: 7,
        instances: 1,
        memory_mb: 81152,
        multiprocessors: 132,
        copy_engines: 8,
        decoders: 7,
        jpegs: 7,
        ofas: 1,
        size: 8,
        starts: &[0],
    },
    Profile {
        index: 7,
        id: 20,
        name: "1g.10gb+me",
        slices: 1,
        instances: 1,
        memory_mb: 9984,
        multiprocessors: 16,
        copy_engines: 1,
        decoders: 1,
        jpegs: 1,
        ofas: 1,
        size: 1,
        starts: &[0, 1, 2, 3, 4, 5, 6],
    },
    Profile {
        index: 9,
        id: 15,
        name: "1g.20gb",
        slices: 1,
        instances: 4,
        memory_mb: 20096,
        multiprocessors: 26,
        copy_engines: 1,
        decoders: 1,
        jpegs: 1,
        ofas: 0,
        size: 2,
        starts: &[0, 2, 4, 6],
    },
];

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of NVML 13's header: an index at or past it is invalid.
pub const GPU_INSTANCE_PROFILE_COUNT: u32 = 18;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of NVML 13's header.
pub const COMPUTE_INSTANCE_PROFILE_COUNT: u32 = 9;

pub fn by_index(index: u32) -> Option<&'static Profile> {
    H100_80GB.iter().find(|p| p.index == index)
}

pub fn by_id(id: u32) -> Option<&'static Profile> {
    H100_80GB.iter().find(|p| p.id == id)
}

pub fn by_name(name: &str) -> Option<&'static Profile> {
    H100_80GB.iter().find(|p| p.name == name)
}

/// The profile of one of the inventory's instances (checked by [`place`] when it was parsed).
pub fn of(m: &Mig) -> &'static Profile {
    by_name(&m.profile).expect("the inventory's MIG profiles were checked when it was parsed")
}

/// NVML's `NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE` index for `n` compute slices; a compute
/// instance profile's id is its index.
pub fn compute_profile_index(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => return None,
    })
}

/// Checks a MIG GPU's instances against the profiles and sets each one's `placement_start`: the
/// one it names, or else the first free start of its profile, in inventory order, as the driver
/// picks one for `nvidia-smi mig -cgi` without a placement.
pub fn place(gpu: &mut Gpu) -> Result<(), String> {
    let mut used = [false; 8];
    let mut ids = std::collections::BTreeSet::new();
    for m in &mut gpu.mig {
        let uuid = &m.uuid;
        let Some(p) = by_name(&m.profile) else {
            let known: Vec<&str> = H100_80GB.iter().map(|p| p.name).collect();
            return Err(format!(
                "{uuid}: profile {} is not one of an H100 80GB's: {}",
                m.profile,
                known.join(", ")
            ));
        };
        if m.gpu_instance_slices != p.slices {
            return Err(format!(
                "{uuid}: gpuInstanceSlices {} does not match profile {} ({} slices)",
                m.gpu_instance_slices, p.name, p.slices
            ));
        }
        if !ids.insert(m.gpu_instance_id) {
            return Err(format!(
                "{uuid}: GPU instance id {} appears twice on {}",
                m.gpu_instance_id, gpu.uuid
            ));
        }
        let free = |s: u32| (s..s + p.size).all(|i| !used[i as usize]);
        let start = match m.placement_start {
            Some(s) if !p.starts.contains(&s) => {
                return Err(format!(
                    "{uuid}: placementStart {s} is not one of profile {}'s {:?}",
                    p.name, p.starts
                ));
            }
            Some(s) if !free(s) => {
                return Err(format!("{uuid}: placementStart {s} overlaps another instance"));
            }
            Some(s) => s,
            None => *p.starts.iter().find(|&&s| free(s)).ok_or_else(|| {
                format!("{uuid}: no placement of profile {} is free on {}", p.name, gpu.uuid)
            })?,
        };
        for i in start..start + p.size {
            used[i as usize] = true;
        }
        m.placement_start = Some(start);
    }
    for p in &H100_80GB {
        let n = gpu.mig.iter().filter(|m| m.profile == p.name).count() as u32;
        if n > p.instances {
            return Err(format!(
                "{}: {n} instances of {}, an H100 80GB holds {}",
                gpu.uuid, p.name, p.instances
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Inventory;

    fn gpu(migs: &[(&str, u32, Option<u32>)]) -> String {
        let migs: Vec<String> = migs
            .iter()
            .enumerate()
            .map(|(i, (profile, slices, start))| {
                let start = start.map(|s| format!(r#", "placementStart": {s}"#)).unwrap_or_default();
                format!(
                    r#"{{"uuid": "MIG-{i}", "profile": "{profile}", "memoryBytes": 1, "gpuInstanceId": {}, "multiprocessors": 1, "gpuInstanceSlices": {slices}{start}}}"#,
                    i + 1
                )
            })
            .collect();
        format!(
            r#"{{"gpus": [{{"uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3", "memoryBytes": 1, "migEnabled": true, "mig": [{}]}}]}}"#,
            migs.join(",")
        )
    }

    fn starts(text: &str) -> Result<Vec<u32>, String> {
        Ok(Inventory::parse(text)?.gpus[0].mig.iter().map(|m| m.placement_start.unwrap()).collect())
    }

    #[test]
    fn instances_take_the_first_free_placement_of_their_profile_in_order() {
        // 3g.40gb first takes slices 0-3; the 1g.10gbs fill 4, 5, 6; nothing is left for a 1g.20gb.
        let text =
            gpu(&[("3g.40gb", 3, None), ("1g.10gb", 1, None), ("1g.10gb", 1, None), ("1g.10gb", 1, None)]);
        assert_eq!(starts(&text), Ok(vec![0, 4, 5, 6]));
        // The 1g.20gb skips the odd starts; the 2g.20gb after it lands on 2.
        assert_eq!(starts(&gpu(&[("1g.20gb", 1, None), ("2g.20gb", 2, None)])), Ok(vec![0, 2]));
        // A named start holds; the next instance goes around it.
        assert_eq!(starts(&gpu(&[("3g.40gb", 3, Some(4)), ("3g.40gb", 3, None)])), Ok(vec![4, 0]));
        // The whole GPU.
        assert_eq!(starts(&gpu(&[("7g.80gb", 7, None)])), Ok(vec![0]));
    }

    #[test]
    fn an_instance_that_does_not_fit_an_h100_is_refused_with_its_reason() {
        let cases = [
            (gpu(&[("5g.50gb", 5, None)]), "profile 5g.50gb is not one of an H100 80GB's"),
            (gpu(&[("2g.20gb", 1, None)]), "gpuInstanceSlices 1 does not match profile 2g.20gb (2 slices)"),
            (gpu(&[("3g.40gb", 3, Some(2))]), "placementStart 2 is not one of profile 3g.40gb's [0, 4]"),
            (
                gpu(&[("1g.10gb", 1, None), ("2g.20gb", 2, Some(0))]),
                "placementStart 0 overlaps another instance",
            ),
            (gpu(&[("7g.80gb", 7, None), ("1g.10gb", 1, None)]), "no placement of profile 1g.10gb is free"),
            (
                gpu(&[("1g.10gb+me", 1, None), ("1g.10gb+me", 1, None)]),
                "2 instances of 1g.10gb+me, an H100 80GB holds 1",
            ),
        ];
        for (text, want) in cases {
            let e = starts(&text).expect_err(want);
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn every_placement_of_a_profile_lies_on_the_gpus_eight_memory_slices() {
        for p in &H100_80GB {
            assert!(p.starts.iter().all(|s| s + p.size <= 8), "{}", p.name);
            assert!(p.instances as usize <= p.starts.len(), "{}", p.name);
            assert!(p.index < GPU_INSTANCE_PROFILE_COUNT, "{}", p.name);
            assert_eq!(by_id(p.id), Some(p));
            assert_eq!(by_index(p.index), Some(p));
        }
    }
}
