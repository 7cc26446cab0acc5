// Command kubeletplugin drives a DRA kubelet plugin with the kubelet's own code, so that the e2e
// suite checks our driver agent against the real client side of both kubelet plugin protocols.
//
// It runs, in one process and as the kubelet wires them:
//
//   - the kubelet plugin manager (k8s.io/kubernetes/pkg/kubelet/pluginmanager): its plugin watcher
//     finds the registration socket in --registry-dir, its reconciler calls GetInfo, validates and
//     registers the plugin and calls NotifyRegistrationStatus;
//   - the kubelet DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra), whose DRA plugin manager
//     (cm/dra/plugin) is the plugin manager's "DRAPlugin" handler: it chooses the gRPC service
//     from the advertised versions and owns the gRPC connection;
//   - then, for one pod read from the API server, what the kubelet does when the pod starts
//     (Manager.PrepareResources, then Manager.GetResources per container for the CDI device ids
//     handed to the runtime) or ends (Manager.UnprepareResources).
//
// It prints one JSON object on stdout and exits non-zero on failure. Only the container runtime
// and the pod workers are missing; see README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type options struct {
	kubeconfig  string
	node        string
	registryDir string
	stateDir    string
	driver      string
	pod         string
	timeout     time.Duration
}

// Result is what gets printed.
type Result struct {
	Op string `json:"op"`
	// Registered is true once the kubelet's DRA plugin manager has the driver registered.
	Registered bool `json:"registered"`
	// Containers maps container name to the CDI device ids the kubelet would pass to the runtime.
	Containers map[string][]string `json:"containers,omitempty"`
	// Claims lists the prepared claims as the kubelet recorded them.
	Claims []Claim `json:"claims,omitempty"`
}

type Claim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	UID       string   `json:"uid"`
	Devices   []Device `json:"devices"`
}

type Device struct {
	Driver       string   `json:"driver"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	RequestNames []string `json:"requestNames"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

func main() {
	var o options
	klog.InitFlags(nil)
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "admin kubeconfig of the cluster")
	flag.StringVar(&o.node, "node", "", "the node the plugin serves (its pool name)")
	flag.StringVar(&o.registryDir, "registry-dir", "", "the kubelet's plugins_registry directory")
	flag.StringVar(&o.stateDir, "state-dir", "", "directory for the DRA manager's checkpoint (the kubelet's /var/lib/kubelet)")
	flag.StringVar(&o.driver, "driver", "gpu.switchyard.dev", "DRA driver name to wait for")
	flag.StringVar(&o.pod, "pod", "", "namespace/name of the pod whose claims to prepare or unprepare")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "overall deadline")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] register|prepare|unprepare\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || (flag.Arg(0) != "register" && flag.Arg(0) != "prepare" && flag.Arg(0) != "unprepare") {
		flag.Usage()
		os.Exit(2)
	}
	res, err := run(o, flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeletplugin:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

func run(o options, op string) (*Result, error) {
	// register: only what the kubelet does when the plugin's socket appears (GetInfo, then
	// NotifyRegistrationStatus), with no pod; the other operations register first too.
	ns, name, ok := strings.Cut(o.pod, "/")
	if (!ok && op != "register") || o.node == "" || o.registryDir == "" || o.stateDir == "" {
		return nil, errors.New("--pod namespace/name (but for register), --node, --registry-dir and --state-dir are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	logger := klog.FromContext(ctx)

	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var pod *v1.Pod
	if op != "register" {
		if pod, err = client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("get pod: %w", err)
		}
	}

	// The DRA manager as kubelet.NewMainKubelet/ContainerManager creates and starts it. Sources
	// never become ready, so its reconcile loop (which unprepares claims of pods that are gone)
	// stays idle: this process prepares and unprepares only when told to.
	manager, err := dra.NewManager(logger, client, o.stateDir)
	if err != nil {
		return nil, err
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, o.node, metav1.GetOptions{})
	}
	activePods := func() []*v1.Pod {
		if pod == nil {
			return nil
		}
		return []*v1.Pod{pod}
	}
	notReady := config.NewSourcesReady(func(sets.Set[string]) bool { return false })
	if err := manager.Start(ctx, activePods, getNode, notReady); err != nil {
		return nil, err
	}
	defer manager.Stop()

	// The plugin manager with the DRA handler, as kubelet.Run registers it.
	stop := make(chan struct{})
	defer close(stop)
	pm := pluginmanager.NewPluginManager(o.registryDir, record.NewFakeRecorder(100))
	pm.AddHandler(registerapi.DRAPlugin, manager.GetWatcherHandler())
	go pm.Run(ctx, notReady, stop)

	plugins, ok := manager.GetWatcherHandler().(*draplugin.DRAPluginManager)
	if !ok {
		return nil, errors.New("the DRA watcher handler is not a *plugin.DRAPluginManager")
	}
	for {
		if _, err := plugins.GetPlugin(o.driver); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("driver %s did not register through %s: %w", o.driver, o.registryDir, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}

	res := &Result{Op: op, Registered: true}
	switch op {
	case "register":
		// The plugin manager notifies the plugin right after its handler registered it; staying
		// until the agent's slices lose their not-registered taint keeps that notification from
		// being cut off by this process's exit, and shows the agent heard it.
		if err := waitUntagged(ctx, client, o.driver, o.node); err != nil {
			return nil, err
		}
	case "prepare":
		if err := manager.PrepareResources(ctx, pod); err != nil {
			return nil, err
		}
		res.Containers = map[string][]string{}
		for i := range pod.Spec.Containers {
			c := &pod.Spec.Containers[i]
			info, err := manager.GetResources(pod, c)
			if err != nil {
				return nil, err
			}
			ids := []string{}
			for _, d := range info.CDIDevices {
				ids = append(ids, d.Name)
			}
			res.Containers[c.Name] = ids
			infos, err := manager.GetContainerClaimInfos(pod, c)
			if err != nil {
				return nil, err
			}
			for _, ci := range infos {
				res.Claims = appendClaim(res.Claims, ci)
			}
		}
	case "unprepare":
		if err := manager.UnprepareResources(ctx, pod); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func appendClaim(claims []Claim, ci *dra.ClaimInfo) []Claim {
	for _, c := range claims {
		if c.UID == string(ci.ClaimUID) {
			return claims
		}
	}
	c := Claim{Namespace: ci.Namespace, Name: ci.ClaimName, UID: string(ci.ClaimUID), Devices: []Device{}}
	for driver, st := range ci.DriverState {
		for _, d := range st.Devices {
			c.Devices = append(c.Devices, Device{
				Driver: driver, Pool: d.PoolName, Device: d.DeviceName,
				RequestNames: d.RequestNames, CDIDeviceIDs: d.CDIDeviceIDs,
			})
		}
	}
	return append(claims, c)
}

// waitUntagged waits until every device of driver's ResourceSlices for node is published without
// the agent's <driver>/kubelet-plugin-not-registered taint.
func waitUntagged(ctx context.Context, client kubernetes.Interface, driver, node string) error {
	key := driver + "/kubelet-plugin-not-registered"
	for {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + driver,
		})
		tainted := err != nil || len(list.Items) == 0
		if err == nil {
			for _, s := range list.Items {
				for _, d := range s.Spec.Devices {
					for _, t := range d.Taints {
						tainted = tainted || t.Key == key
					}
				}
			}
		}
		if !tainted {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the slices of %s on %s still carry %s (or none is published; last error %v): %w", driver, node, key, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
