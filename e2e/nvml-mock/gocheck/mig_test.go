package gocheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// h100Profile is one GPU instance profile of an H100 80GB HBM3 as `nvidia-smi mig -lgip` lists it,
// with its possible placements as `nvidia-smi mig -lgipp` prints them ({starts}:size, in memory
// slices).
type h100Profile struct {
	index                      int
	id, slices, instances, sms uint32
	memoryMB                   uint64
	placements                 string
}

// h100Profiles are an H100 80GB HBM3's, by NVML's profile index; every other index is not
// supported on it.
var h100Profiles = []h100Profile{
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 16, 9984, "{0,1,2,3,4,5,6}:1"},
	{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 32, 20096, "{0,2,4}:2"},
	{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 60, 40448, "{0,4}:4"},
	{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 64, 40448, "{0}:4"},
	{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 132, 81152, "{0}:8"},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 16, 9984, "{0,1,2,3,4,5,6}:1"},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 26, 20096, "{0,2,4,6}:2"},
}

func placementsText(ps []nvml.GpuInstancePlacement) string {
	if len(ps) == 0 {
		return "none"
	}
	starts := make([]string, len(ps))
	for i, p := range ps {
		starts[i] = fmt.Sprint(p.Start)
		if p.Size != ps[0].Size {
			return fmt.Sprintf("mixed sizes %+v", ps)
		}
	}
	return fmt.Sprintf("{%s}:%d", strings.Join(starts, ","), ps[0].Size)
}

// TestMigProfilesAndPlacementsAreAnH100s reads, through go-nvml as NVIDIA's DRA driver does
// (cmd/gpu-kubelet-plugin/nvlib.go), the GPU instance profiles of the inventory's GPU in MIG mode,
// each profile's possible placements, the instances of each profile and where each sits: they are
// an H100 80GB's, and the 1g.10gb and 3g.40gb instances sit where the driver would create them
// one after the other (slice 0, then slices 4-7).
func TestMigProfilesAndPlacementsAreAnH100s(t *testing.T) {
	lib, _ := loaded(t, inventory)
	defer lib.Shutdown()

	whole, _ := lib.DeviceGetHandleByIndex(0)
	if _, ret := whole.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("profile info of a GPU not in MIG mode: %v, want ERROR_NOT_SUPPORTED", nvml.ErrorString(ret))
	}
	gpu, _ := lib.DeviceGetHandleByIndex(1)
	byIndex := map[int]h100Profile{}
	for _, p := range h100Profiles {
		byIndex[p.index] = p
	}
	instances := map[string]string{}
	for i := 0; i <= nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := gpu.GetGpuInstanceProfileInfo(i)
		want, supported := byIndex[i]
		switch {
		case i == nvml.GPU_INSTANCE_PROFILE_COUNT:
			if ret != nvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("profile index %d (the count): %v, want ERROR_INVALID_ARGUMENT", i, nvml.ErrorString(ret))
			}
			continue
		case !supported:
			if ret != nvml.ERROR_NOT_SUPPORTED {
				t.Errorf("profile index %d: %v, want ERROR_NOT_SUPPORTED (no such profile on an H100)", i, nvml.ErrorString(ret))
			}
			continue
		}
		ok(t, fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", i), ret)
		got := h100Profile{i, info.Id, info.SliceCount, info.InstanceCount, info.MultiprocessorCount, info.MemorySizeMB, ""}
		placements, ret := gpu.GetGpuInstancePossiblePlacements(&info)
		ok(t, fmt.Sprintf("GetGpuInstancePossiblePlacements(%d)", info.Id), ret)
		got.placements = placementsText(placements)
		if got != want {
			t.Errorf("profile index %d:\n got %+v\nwant %+v", i, got, want)
		}
		gis, ret := gpu.GetGpuInstances(&info)
		ok(t, fmt.Sprintf("GetGpuInstances(%d)", info.Id), ret)
		for _, gi := range gis {
			giInfo, ret := gi.GetInfo()
			ok(t, "GpuInstance.GetInfo", ret)
			if giInfo.ProfileId != info.Id {
				t.Errorf("an instance of profile %d reads profile %d", info.Id, giInfo.ProfileId)
			}
			// The compute instance that spans it, as NVIDIA's driver matches it to a profile.
			ciIndex := map[uint32]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
				3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
				7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[info.SliceCount]
			ciProfile, ret := gi.GetComputeInstanceProfileInfo(ciIndex, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			ok(t, "GetComputeInstanceProfileInfo", ret)
			cis, ret := gi.GetComputeInstances(&ciProfile)
			ok(t, "GetComputeInstances", ret)
			if len(cis) != 1 || ciProfile.SliceCount != info.SliceCount {
				t.Errorf("instance %d: %d compute instances of %d slices, want 1 spanning its %d", giInfo.Id, len(cis), ciProfile.SliceCount, info.SliceCount)
			}
			instances[fmt.Sprintf("gi %d", giInfo.Id)] = fmt.Sprintf("profile %d at %s", info.Id, placementsText([]nvml.GpuInstancePlacement{giInfo.Placement}))
		}
	}
	wantInstances := map[string]string{"gi 9": "profile 19 at {0}:1", "gi 2": "profile 9 at {4}:4"}
	if fmt.Sprint(instances) != fmt.Sprint(wantInstances) {
		t.Errorf("instances %v, want %v", instances, wantInstances)
	}
	if _, ret := whole.GetGpuInstancePossiblePlacements(&nvml.GpuInstanceProfileInfo{Id: 19}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("placements on a GPU not in MIG mode: %v, want ERROR_NOT_SUPPORTED", nvml.ErrorString(ret))
	}
}
