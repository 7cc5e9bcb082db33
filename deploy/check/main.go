// Command check validates sandboxd's deployment files against the real
// things they are for (scripts/deploy-check.sh runs it in make test):
//
//	check compose FILE
//	    loads FILE with compose-go, the loader of Docker Compose itself
//	    (the compose specification's schema, interpolation, profiles),
//	    with no profile and with `incus`, and checks the services each
//	    gives and that every file it mounts from the repository exists
//	check dashboard FILE METRICS_URL PROMETHEUS_URL
//	    checks a Grafana dashboard's shape (ids, grid, datasource), then
//	    runs every query of it on a real Prometheus that scrapes a real
//	    sandboxd: each must evaluate, and each sandboxd metric it names
//	    must be in sandboxd's /metrics and scraped by Prometheus
//
// Each check prints `ok` or `FAIL` and a line; the last line is
// `N passed, N failed`, and the exit status is 1 when any failed.
//
// It is a module of its own so that compose-go stays out of sandboxd's.
package main

import (
	"fmt"
	"os"
)

type results struct{ pass, fail int }

func (r *results) check(name string, err error) {
	if err != nil {
		r.fail++
		fmt.Printf("FAIL %s: %v\n", name, err)
		return
	}
	r.pass++
	fmt.Printf("ok   %s\n", name)
}

func main() {
	var r results
	switch {
	case len(os.Args) == 3 && os.Args[1] == "compose":
		checkCompose(&r, os.Args[2])
	case len(os.Args) == 5 && os.Args[1] == "dashboard":
		checkDashboard(&r, os.Args[2], os.Args[3], os.Args[4])
	default:
		fmt.Fprintln(os.Stderr, "usage: check compose FILE | check dashboard FILE METRICS_URL PROMETHEUS_URL")
		os.Exit(2)
	}
	fmt.Printf("%d passed, %d failed\n", r.pass, r.fail)
	if r.fail > 0 || r.pass == 0 {
		os.Exit(1)
	}
}
