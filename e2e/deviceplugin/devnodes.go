package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// devNode is a character device node the plugin creates under --dev-dir and hands to containers.
type devNode struct {
	name         string // file name, also the name under /dev in the container
	major, minor uint32
}

const nvidiaMajor = 195

// controlNodes are the nodes every NVIDIA container gets besides its GPUs.
var controlNodes = []devNode{
	{name: "nvidiactl", major: nvidiaMajor, minor: 255},
	{name: "nvidia-uvm", major: 508, minor: 0},
	{name: "nvidia-uvm-tools", major: 508, minor: 1},
}

// gpuNode is /dev/nvidia<minor>.
func gpuNode(minor int) devNode {
	return devNode{name: "nvidia" + strconv.Itoa(minor), major: nvidiaMajor, minor: uint32(minor)}
}

// ensureDevNodes creates dir and the control nodes and GPU nodes for minors in it.
func ensureDevNodes(dir string, minors []int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create dev dir: %w", err)
	}
	nodes := append([]devNode(nil), controlNodes...)
	for _, m := range minors {
		nodes = append(nodes, gpuNode(m))
	}
	for _, n := range nodes {
		if err := ensureDevNode(filepath.Join(dir, n.name), n.major, n.minor); err != nil {
			return err
		}
	}
	return nil
}

// ensureDevNode makes path a character device major:minor with mode 0666, replacing whatever else
// is there. It does nothing when the node is already right.
func ensureDevNode(path string, major, minor uint32) error {
	want := unix.Mkdev(major, minor)
	var st unix.Stat_t
	switch err := unix.Lstat(path, &st); {
	case err == nil:
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && uint64(st.Rdev) == want && st.Mode&0o777 == 0o666 {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("replace %s: %w", path, err)
		}
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(want)); err != nil {
		return fmt.Errorf("mknod %s (%d:%d): %w", path, major, minor, err)
	}
	// The umask may have cleared bits.
	if err := os.Chmod(path, 0o666); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}
