package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// inventoryFile is the part of the driver agent's simulated-inventory YAML that this plugin uses
// (see driver-agent/src/discovery/simulated.rs). Other keys are ignored.
type inventoryFile struct {
	GPUs []inventoryGPU `json:"gpus"`
}

type inventoryGPU struct {
	Index      int            `json:"index"`
	Minor      int            `json:"minor"`
	UUID       string         `json:"uuid"`
	MIGEnabled *bool          `json:"migEnabled"`
	MIG        []inventoryMIG `json:"mig"`
}

type inventoryMIG struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"`
}

// migEnabled is the agent's rule: an explicit migEnabled wins, otherwise "has MIG devices".
func (g *inventoryGPU) migEnabled() bool {
	if g.MIGEnabled != nil {
		return *g.MIGEnabled
	}
	return len(g.MIG) > 0
}

// device is one device advertised to the kubelet: its ID (a GPU or MIG UUID) and the minor of
// the /dev/nvidia<minor> node it needs (for a MIG device, its parent GPU's).
type device struct {
	ID    string
	Minor int
}

// resourceNamePart is what Kubernetes accepts after the "/" of an extended resource name.
var resourceNamePart = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// loadInventory reads and parses the inventory file.
func loadInventory(path string) (*inventoryFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read inventory: %w", err)
	}
	inv, err := parseInventory(data)
	if err != nil {
		return nil, fmt.Errorf("inventory %s: %w", path, err)
	}
	return inv, nil
}

// parseInventory parses inventory YAML and checks what the plugin relies on: non-empty, unique
// UUIDs, non-negative minors, and no MIG devices on a GPU with migEnabled: false.
func parseInventory(data []byte) (*inventoryFile, error) {
	var inv inventoryFile
	if err := yaml.Unmarshal(data, &inv); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	seen := map[string]bool{}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if g.Minor < 0 {
			return nil, fmt.Errorf("gpu-%d: minor %d is negative", g.Index, g.Minor)
		}
		if !g.migEnabled() && len(g.MIG) > 0 {
			return nil, fmt.Errorf("gpu-%d has MIG devices but migEnabled: false", g.Index)
		}
		ids := []string{g.UUID}
		for _, m := range g.MIG {
			if m.Profile == "" {
				return nil, fmt.Errorf("gpu-%d: MIG device %q has no profile", g.Index, m.UUID)
			}
			ids = append(ids, m.UUID)
		}
		for _, id := range ids {
			if id == "" || seen[id] {
				return nil, fmt.Errorf("gpu-%d: uuid %q is empty or appears twice", g.Index, id)
			}
			seen[id] = true
		}
	}
	return &inv, nil
}

// resources maps the inventory to extended resources, NVIDIA's "mixed" MIG strategy: whole GPUs
// without MIG are <prefix>/gpu, MIG devices are <prefix>/mig-<profile>, and a MIG-enabled GPU is
// not advertised itself. Devices keep inventory order.
func resources(inv *inventoryFile, prefix string) (map[string][]device, error) {
	out := map[string][]device{}
	for _, g := range inv.GPUs {
		if !g.migEnabled() {
			name := prefix + "/gpu"
			out[name] = append(out[name], device{ID: g.UUID, Minor: g.Minor})
			continue
		}
		for _, m := range g.MIG {
			// Profiles such as "1g.10gb+me" become "mig-1g.10gb.me", as NVIDIA's plugin names them.
			part := "mig-" + strings.ReplaceAll(m.Profile, "+", ".")
			if len(part) > 63 || !resourceNamePart.MatchString(part) {
				return nil, fmt.Errorf("gpu-%d: MIG profile %q does not make a valid resource name", g.Index, m.Profile)
			}
			name := prefix + "/" + part
			out[name] = append(out[name], device{ID: m.UUID, Minor: g.Minor})
		}
	}
	return out, nil
}

// gpuMinors lists the minors of every GPU in the inventory, MIG-enabled or not.
func gpuMinors(inv *inventoryFile) []int {
	minors := make([]int, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		minors = append(minors, g.Minor)
	}
	return minors
}
