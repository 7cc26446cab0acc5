// Command etcd is the upstream etcd server, built from the module proxy for the e2e control plane.
//
// It is the same entry point as etcd's own main package; we wrap it because the root
// go.etcd.io/etcd/v3 module pins its sub-modules with local replace directives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
