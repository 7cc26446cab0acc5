// Command pause is the process that holds a pod sandbox's namespaces open on the e2e nodes: it
// sleeps until SIGINT or SIGTERM and reaps the children re-parented to it when the pod shares its
// PID namespace. With -v it prints its version and exits 0, which makes it a canary that ends.
// It does what registry.k8s.io/pause does, built from source here because these machines cannot
// pull images; the image is tagged under that name for the containerd sandbox.
package main

import (
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && strings.EqualFold(os.Args[1], "-v") {
		os.Stdout.WriteString("pause (switchyard e2e) 3.10\n")
		return
	}
	if os.Getpid() != 1 {
		os.Stderr.WriteString("pause: warning: not running as PID 1\n")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited; WNOHANG so that live children do not block us.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
