// Package nvfm stands in, at compile time only, for NVIDIA's go-nvfm bindings to the Fabric
// Manager library (libnvfm.so), whose module github.com/NVIDIA/go-nvfm v0.1.0 the Go module proxy
// does not serve (403). NVIDIA's DRA driver imports it from pkg/fabricmanager, which its GPU
// kubelet plugin reaches only with the FabricManagerPartitioning feature gate on and an NVSwitch or
// NVLink5 fabric on the node. Neither holds on the e2e nodes, so no call lands here; if one did,
// it answers as a node without the Fabric Manager library does: ERROR_LIBRARY_NOT_FOUND.
//
// The surface is the part pkg/fabricmanager of sigs.k8s.io/dra-driver-nvidia-gpu v0.5.0 uses,
// written from those call sites.
package nvfm

import "fmt"

// Return is a Fabric Manager status code.
type Return int32

const (
	SUCCESS                 Return = 0
	ERROR_LIBRARY_NOT_FOUND Return = -1
)

func (r Return) String() string {
	switch r {
	case SUCCESS:
		return "SUCCESS"
	case ERROR_LIBRARY_NOT_FOUND:
		return "ERROR_LIBRARY_NOT_FOUND (go-nvfm is not served by the module proxy; see e2e/nvidia-dra)"
	default:
		return fmt.Sprintf("Return(%d)", int32(r))
	}
}

func (r Return) Error() string { return r.String() }

// FabricPartitionId names one fabric partition.
type FabricPartitionId uint32

// FabricPartitionGpuInfo is one GPU of a partition.
type FabricPartitionGpuInfo struct {
	PhysicalId          uint32
	Uuid                [80]int8
	PciBusId            [32]int8
	NumNvLinksAvailable uint32
	MaxNumNvLinks       uint32
	NvlinkLineRateMBps  uint32
}

// FabricPartitionInfo is one partition.
type FabricPartitionInfo struct {
	PartitionId uint32
	IsActive    uint32
	NumGpus     uint32
	GpuInfo     [16]FabricPartitionGpuInfo
}

// FabricPartitionList is the answer to GetSupportedFabricPartitions.
type FabricPartitionList struct {
	NumPartitions uint32
	PartitionInfo [64]FabricPartitionInfo
}

// Handle is a connection to nv-fabricmanager.
type Handle interface {
	Disconnect() Return
	GetSupportedFabricPartitions() (FabricPartitionList, Return)
	ActivateFabricPartition(FabricPartitionId) Return
	DeactivateFabricPartition(FabricPartitionId) Return
}

// Interface is the library.
type Interface interface {
	Init() Return
	Shutdown() Return
	Connect(...ConnectOption) (Handle, Return)
}

// LibraryOption configures New.
type LibraryOption func(*library)

// ConnectOption configures Connect.
type ConnectOption func(*connect)

type library struct{ path string }

type connect struct {
	address   string
	socket    bool
	timeoutMs uint32
}

// WithLibraryPath names the library file.
func WithLibraryPath(path string) LibraryOption { return func(l *library) { l.path = path } }

// WithUnixSocket connects over a unix socket.
func WithUnixSocket(path string) ConnectOption {
	return func(c *connect) { c.address, c.socket = path, true }
}

// WithAddress connects over TCP.
func WithAddress(address string) ConnectOption { return func(c *connect) { c.address = address } }

// WithTimeoutMs bounds the connect.
func WithTimeoutMs(ms uint32) ConnectOption { return func(c *connect) { c.timeoutMs = ms } }

// New returns the library; every call reports it missing.
func New(opts ...LibraryOption) Interface {
	l := &library{}
	for _, o := range opts {
		o(l)
	}
	return l
}

func (*library) Init() Return     { return ERROR_LIBRARY_NOT_FOUND }
func (*library) Shutdown() Return { return ERROR_LIBRARY_NOT_FOUND }

func (*library) Connect(...ConnectOption) (Handle, Return) {
	return nil, ERROR_LIBRARY_NOT_FOUND
}
