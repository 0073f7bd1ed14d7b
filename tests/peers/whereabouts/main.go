// whereabouts-reconcile: one run of whereabouts' own IP reconciler (pkg/reconciler, the code its
// ip-control-loop runs on a cron schedule), against the API server of a kubeconfig instead of the
// in-cluster service account. It frees every IPPool allocation and OverlappingRangeIPReservation
// whose pod is gone or whose pod's network-status does not list the address, exactly as the
// DaemonSet's reconciler would. Prints the addresses it freed, one per line.
//
//	whereabouts-reconcile -kubeconfig /path/to/kubeconfig
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/k8snetworkplumbingwg/whereabouts/pkg/reconciler"
	"github.com/k8snetworkplumbingwg/whereabouts/pkg/storage/kubernetes"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig of the API server to reconcile")
	flag.Parse()
	client, err := kubernetes.NewClientViaKubeconfig(*kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "whereabouts-reconcile: client: %v\n", err)
		os.Exit(1)
	}
	looper, err := reconciler.NewReconcileLooperWithClient(client)
	if err != nil {
		fmt.Fprintf(os.Stderr, "whereabouts-reconcile: %v\n", err)
		os.Exit(1)
	}
	freed, err := looper.ReconcileIPPools()
	if err != nil {
		fmt.Fprintf(os.Stderr, "whereabouts-reconcile: pools: %v\n", err)
		os.Exit(1)
	}
	if err := looper.ReconcileOverlappingIPAddresses(); err != nil {
		fmt.Fprintf(os.Stderr, "whereabouts-reconcile: reservations: %v\n", err)
		os.Exit(1)
	}
	for _, ip := range freed {
		fmt.Println(ip.String())
	}
}
