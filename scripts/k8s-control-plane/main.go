// One binary for the three control-plane programs: the name it is started as (argv[0], a symlink made by
// scripts/k8s-cluster) picks the program, so the large shared packages are compiled and linked once.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json, as the upstream mains register
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as the upstream mains register
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as the upstream mains register
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	programs := map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	}
	name := filepath.Base(os.Args[0])
	newCommand, known := programs[name]
	if !known {
		fmt.Fprintf(os.Stderr, "%s: start this binary as kube-apiserver, kube-controller-manager or kube-scheduler (a symlink of that name)\n", name)
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}
