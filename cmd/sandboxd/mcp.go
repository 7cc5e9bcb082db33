package main

// `sandboxd mcp`: sandboxd's MCP tools over stdio, for desktop agents that
// start their MCP servers as commands. It bridges to a running sandboxd's
// /mcp (streamable HTTP), where the tools, scopes and limits live.
//
//	sandboxd mcp [--url http://127.0.0.1:3000] [--token TOKEN]
//
// --url and --token also come from SANDBOXD_URL and SANDBOXD_TOKEN; the
// token is a JWT from `sandboxd token create` or an API key. Logs go to
// stderr: stdout is the protocol.

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"syscall"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/mcp"
)

func mcpCmd(args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	u := fs.String("url", "http://127.0.0.1:3000", "sandboxd URL (env SANDBOXD_URL)")
	tok := fs.String("token", "", "JWT or API key (env SANDBOXD_TOKEN)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// Validates the URL and the token's presence as the other clients do.
	if _, err := newAPIClient(*u, *tok); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := mcp.Bridge(ctx, mcp.BridgeConfig{URL: *u, Token: *tok, Version: version}, &sdk.StdioTransport{})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
