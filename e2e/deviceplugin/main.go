// Command device-plugin is a simulated NVIDIA device plugin for Switchyard's end-to-end tests.
//
// It speaks the real kubelet device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1),
// so that a real kubelet's device manager sets the node's capacity and allocatable for
// nvidia.com/gpu and nvidia.com/mig-<profile> (NVIDIA's "mixed" MIG strategy). The GPUs come from
// the driver agent's simulated-inventory YAML file (driver-agent/src/discovery/simulated.rs),
// re-read every --resync.
//
// What it fakes: there are no GPUs and no NVIDIA driver. Every device is always Healthy, and the
// device nodes it hands to containers (/dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm,
// /dev/nvidia-uvm-tools) are character nodes it creates itself with mknod under --dev-dir, with
// the real majors and minors but no driver behind them. Allocate only sets NVIDIA_VISIBLE_DEVICES
// and those device nodes; there is no NVIDIA container runtime, CDI or MIG capability device.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// config is the command line.
type config struct {
	inventory      string
	resourcePrefix string
	pluginDir      string
	devDir         string
	resync         time.Duration
	kubeletPoll    time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.inventory, "inventory", "", "simulated-inventory YAML file (required)")
	flag.StringVar(&cfg.resourcePrefix, "resource-prefix", "nvidia.com", "extended resource domain")
	flag.StringVar(&cfg.pluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet device-plugin directory (kubelet.sock and plugin sockets)")
	flag.StringVar(&cfg.devDir, "dev-dir", "/var/lib/kubelet/device-plugins/switchyard-sim-dev", "directory for the simulated device nodes")
	flag.DurationVar(&cfg.resync, "resync", 5*time.Second, "how often to re-read the inventory")
	flag.Parse()
	cfg.kubeletPoll = time.Second

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if cfg.inventory == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: device-plugin --inventory FILE [flags]")
		flag.PrintDefaults()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("device plugin failed", "err", err)
		os.Exit(1)
	}
	log.Info("device plugin stopped")
}

// manager owns the per-resource plugins.
type manager struct {
	cfg       config
	log       *slog.Logger
	plugins   map[string]*plugin
	kubelet   fileID // identity of kubelet.sock when last seen
	lastError string // last resync error, so it is logged once
}

// run serves until ctx ends, then stops every server and removes its sockets.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	if cfg.resync <= 0 || cfg.kubeletPoll <= 0 {
		return errors.New("--resync and the kubelet poll interval must be positive")
	}
	inv, err := loadInventory(cfg.inventory)
	if err != nil {
		return err
	}
	res, err := resources(inv, cfg.resourcePrefix)
	if err != nil {
		return err
	}
	if err := ensureDevNodes(cfg.devDir, gpuMinors(inv)); err != nil {
		return err
	}
	log.Info("starting simulated NVIDIA device plugin", "inventory", cfg.inventory,
		"gpus", len(inv.GPUs), "resources", len(res), "pluginDir", cfg.pluginDir, "devDir", cfg.devDir)

	m := &manager{cfg: cfg, log: log, plugins: map[string]*plugin{}}
	defer m.stopAll()
	if err := m.apply(res); err != nil {
		return err
	}
	if _, ok := statID(m.kubeletSocket()); !ok {
		log.Info("waiting for the kubelet", "socket", m.kubeletSocket())
	}
	m.syncKubelet(ctx)

	resync := time.NewTicker(cfg.resync)
	defer resync.Stop()
	poll := time.NewTicker(cfg.kubeletPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
			m.resync()
			m.syncKubelet(ctx)
		case <-poll.C:
			m.syncKubelet(ctx)
		}
	}
}

func (m *manager) kubeletSocket() string { return filepath.Join(m.cfg.pluginDir, "kubelet.sock") }

// resync re-reads the inventory; on error it keeps the current devices.
func (m *manager) resync() {
	err := func() error {
		inv, err := loadInventory(m.cfg.inventory)
		if err != nil {
			return err
		}
		res, err := resources(inv, m.cfg.resourcePrefix)
		if err != nil {
			return err
		}
		if err := ensureDevNodes(m.cfg.devDir, gpuMinors(inv)); err != nil {
			return err
		}
		return m.apply(res)
	}()
	switch {
	case err != nil && err.Error() != m.lastError:
		m.log.Error("resync failed; keeping the current devices", "err", err)
		m.lastError = err.Error()
	case err == nil && m.lastError != "":
		m.log.Info("resync works again")
		m.lastError = ""
	}
}

// apply brings the plugins in line with res: it updates device sets, starts servers for new
// resources and, for vanished ones, sends an empty device set and stops the server.
func (m *manager) apply(res map[string][]device) error {
	var errs []error
	for _, name := range sortedKeys(res) {
		devs := res[name]
		if p, ok := m.plugins[name]; ok {
			if p.setDevices(devs) {
				m.log.Info("devices changed", "resource", name, "devices", ids(devs))
			}
			continue
		}
		p := newPlugin(name, m.cfg.pluginDir, m.cfg.devDir, m.log, devs)
		if err := p.start(); err != nil {
			errs = append(errs, fmt.Errorf("start %s: %w", name, err))
			continue
		}
		m.plugins[name] = p
		m.log.Info("resource added", "resource", name, "devices", ids(devs))
	}
	for _, name := range sortedKeys(m.plugins) {
		if _, ok := res[name]; ok {
			continue
		}
		p := m.plugins[name]
		p.setDevices(nil)
		p.shutdown()
		delete(m.plugins, name)
		m.log.Info("resource removed", "resource", name)
	}
	return errors.Join(errs...)
}

// syncKubelet registers every plugin that is not registered with the current kubelet. A new
// kubelet.sock means a restarted kubelet: everything registers again, and servers whose sockets
// the kubelet deleted are restarted first.
func (m *manager) syncKubelet(ctx context.Context) {
	id, up := statID(m.kubeletSocket())
	if id != m.kubelet {
		if up {
			m.log.Info("kubelet socket (re)created; registering all resources", "socket", m.kubeletSocket())
		} else {
			m.log.Info("kubelet socket gone", "socket", m.kubeletSocket())
		}
		m.kubelet = id
		for _, p := range m.plugins {
			p.registered = false
		}
	}
	for _, name := range sortedKeys(m.plugins) {
		p := m.plugins[name]
		if !p.socketIntact() {
			m.log.Info("plugin socket gone; restarting its server", "resource", name, "socket", p.socket)
			p.shutdown()
			if err := p.start(); err != nil {
				m.log.Error("restart failed", "resource", name, "err", err)
				continue
			}
			p.registered = false
		}
		if !up || p.registered {
			continue
		}
		if err := p.register(ctx, m.kubeletSocket()); err != nil {
			m.log.Error("registration failed; will retry", "resource", name, "err", err)
			continue
		}
		p.registered = true
		m.log.Info("registered with kubelet", "resource", name, "endpoint", filepath.Base(p.socket))
	}
}

func (m *manager) stopAll() {
	for _, name := range sortedKeys(m.plugins) {
		m.plugins[name].shutdown()
		delete(m.plugins, name)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func ids(devs []device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.ID)
	}
	return out
}
