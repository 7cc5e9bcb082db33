// Command sandboxd is the control plane: E2B's REST API and data-plane proxy
// on the local (or Incus) backend, plus the CLI that manages tenants and keys
// in its data dir.
//
//	sandboxd serve [--listen ADDR] [--data-dir DIR] [--backend local] [--domain D] [--config FILE]
//	sandboxd keys create --tenant NAME | keys list [--tenant NAME] | keys revoke ID
//	sandboxd tenants list | tenants create NAME
//	sandboxd mcp [--url URL] [--token TOKEN]   (MCP over stdio, bridged to a server's /mcp)
//	sandboxd relay --client-cert FILE [--listen :8444] [--cert FILE --key FILE] [--sandbox-subnet CIDR]   (on each Incus cluster member)
//
// Every flag can also come from the environment (SANDBOXD_<FLAG>, dashes as
// underscores) or a --config file; command-line flags win, then the
// environment, then the file.
package main

import (
	"fmt"
	"os"

	"github.com/sandboxd/sandboxd/runtime/local"
)

func main() {
	// libcontainer re-executes this binary as every sandbox's init stage;
	// that must happen before anything else runs.
	local.Init()
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "keys":
		err = keys(os.Args[2:])
	case "tenants":
		err = tenants(os.Args[2:])
	case "token":
		err = token(os.Args[2:])
	case "sandbox":
		err = sandboxCmd(os.Args[2:])
	case "mcp":
		err = mcpCmd(os.Args[2:])
	case "tls":
		err = tlsCmd(os.Args[2:])
	case "relay":
		err = relayCmd(os.Args[2:])
	case "version":
		fmt.Println(version)
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "sandboxd: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		os.Exit(1)
	}
}

const version = "0.1.0"

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  sandboxd serve [--listen 127.0.0.1:3000] [--data-dir ./data] [--store postgres://...] [--backend local] [--domain D] [--config FILE]
  (keys and tenants take --store too: a PostgreSQL store several sandboxd share, one active, see docs/ha.md)
  sandboxd keys create --tenant NAME      print a new API key alone on stdout
  sandboxd keys list [--tenant NAME]
  sandboxd keys revoke ID
  sandboxd tenants list | tenants create NAME
  sandboxd tenants set NAME [--min-warm N] [--max-sandboxes N] [--max-memory-mb N]
        [--{create,lifecycle,read,dataplane}-rate R] [--{create,lifecycle,read,dataplane}-burst B]   ("default" resets)
  sandboxd token create --tenant NAME [--scope "sandboxes:read sandboxes:write"] [--ttl 1h]
  sandboxd sandbox create|list|get|rm|exec|shell|cp ...   (client of a running server; see docs/native-api.md)
  sandboxd mcp [--url http://127.0.0.1:3000] [--token T]   the MCP tools over stdio, for desktop agents
  sandboxd tls init --domain D [--dir DIR]   local CA + certificate for D and *.D (serve --tls-cert/--tls-key)
  sandboxd relay --client-cert FILE [--listen :8444] [--cert FILE --key FILE] [--sandbox-subnet 10.135.0.0/16]
        the pipe from sandboxd to the sandboxes of an Incus cluster member, and the member's firewall
  sandboxd version
Flags also come from SANDBOXD_<FLAG> (e.g. SANDBOXD_DATA_DIR) and --config FILE.
`)
}
