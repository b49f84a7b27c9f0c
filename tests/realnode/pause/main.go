// pause holds a pod's namespaces open until it is told to stop, as Kubernetes' own pause
// (build/pause/linux/pause.c) does: it sleeps, exits 0 on SIGINT or SIGTERM, and reaps the
// zombies of its namespace (it is PID 1 of the pod's sandbox when the PID namespace is shared).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
