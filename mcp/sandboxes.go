package mcp

import (
	"context"
	"errors"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/httpx"
)

// network is a sandbox's egress policy, in the native API's terms.
type network struct {
	AllowOut []string `json:"allowOut,omitempty" jsonschema:"destinations the sandbox may reach even when denyOut or allow_internet=false would refuse them: IPv4 addresses, CIDRs (10.0.0.0/8), host names (pypi.org, *.github.com), each optionally with :port"`
	DenyOut  []string `json:"denyOut,omitempty" jsonschema:"destinations the sandbox may not reach, same forms as allowOut; 0.0.0.0/0 denies everything not in allowOut"`
}

// sandboxOut is a sandbox as the tools report it.
type sandboxOut struct {
	ID            string            `json:"sandbox_id" jsonschema:"the sandbox's id, for the other tools"`
	Template      string            `json:"template"`
	State         string            `json:"state" jsonschema:"running or paused"`
	StartedAt     string            `json:"started_at" jsonschema:"RFC 3339"`
	EndAt         string            `json:"end_at" jsonschema:"RFC 3339 time at which the sandbox is killed unless it is killed before"`
	CPUCount      int               `json:"cpu_count"`
	MemoryMB      int               `json:"memory_mb"`
	DiskMB        int               `json:"disk_mb,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	AllowInternet bool              `json:"allow_internet"`
	Network       *network          `json:"network,omitempty"`
}

func (o sandboxOut) sandbox() string { return o.ID }

func sandboxOf(v sandbox.View) sandboxOut {
	st := v.State
	if st == sandbox.StateResuming {
		st = sandbox.StatePaused // not reachable yet; as the native API says
	}
	out := sandboxOut{
		ID: v.ID, Template: v.Template, State: string(st),
		StartedAt: v.StartedAt.UTC().Format(time.RFC3339), EndAt: v.EndAt.UTC().Format(time.RFC3339),
		CPUCount: v.CPUCount, MemoryMB: v.MemoryMB, DiskMB: v.DiskMB,
		Metadata: v.Metadata, AllowInternet: v.AllowInternetAccess,
	}
	if n := v.Network; n != nil && (len(n.AllowOut) > 0 || len(n.DenyOut) > 0) {
		out.Network = &network{AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	}
	return out
}

var createTool = &sdk.Tool{
	Name: "sandbox_create",
	Description: "Create a new isolated Linux sandbox (a container with its own filesystem, processes and network) " +
		"and return its sandbox_id, which the other tools take. Commands run as the unprivileged user \"user\" " +
		"(home /home/user) unless a tool names another user (\"root\" works). The sandbox is killed when its " +
		"timeout passes; kill it with sandbox_kill as soon as you are done with it.",
	Annotations: &sdk.ToolAnnotations{OpenWorldHint: ptr(true)},
}

type createIn struct {
	Template      string            `json:"template,omitempty" jsonschema:"template to start from (its name or id); default base, a Debian system with bash, python3 and the usual tools"`
	Timeout       int               `json:"timeout,omitempty" jsonschema:"seconds until the sandbox is killed; 0 or absent: the server's default (300 unless configured); capped at the server's maximum"`
	Metadata      map[string]string `json:"metadata,omitempty" jsonschema:"your own key/value labels, returned by sandbox_list and usable as its filter"`
	Env           map[string]string `json:"env,omitempty" jsonschema:"environment variables of every command run in the sandbox"`
	AllowInternet *bool             `json:"allow_internet,omitempty" jsonschema:"whether the sandbox may reach the public internet; default true (private networks and the host are never reachable)"`
	Network       *network          `json:"network,omitempty" jsonschema:"egress rules on top of allow_internet"`
}

func (createIn) sandbox() string { return "" }

func (s *Server) create(ctx context.Context, _ *sdk.CallToolRequest, in createIn) (sandboxOut, error) {
	if in.Timeout < 0 {
		return sandboxOut{}, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
	}
	if err := errors.Join(httpx.CheckMap("metadata", in.Metadata, httpx.MetadataLimits),
		httpx.CheckMap("env", in.Env, httpx.EnvLimits)); err != nil {
		return sandboxOut{}, err
	}
	req := sandbox.CreateRequest{
		Template:      in.Template,
		Timeout:       time.Duration(in.Timeout) * time.Second,
		Secure:        true,
		AllowInternet: in.AllowInternet == nil || *in.AllowInternet,
		Metadata:      in.Metadata,
		EnvVars:       in.Env,
		IdleTTL:       s.cfg.IdleTTL,
	}
	if in.Network != nil {
		req.Network = &sandbox.NetworkConfig{AllowOut: in.Network.AllowOut, DenyOut: in.Network.DenyOut}
	}
	v, err := s.cfg.Sandboxes.CreateView(ctx, req)
	if err != nil {
		return sandboxOut{}, err
	}
	return sandboxOf(v), nil
}

var listTool = &sdk.Tool{
	Name: "sandbox_list",
	Description: "List your live sandboxes (running or paused), newest first, optionally only those whose metadata " +
		"has all the given key/value pairs or that are in the given states. Pages: pass next_cursor back as cursor.",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type listIn struct {
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only sandboxes whose metadata has all these key/value pairs"`
	State    []string          `json:"state,omitempty" jsonschema:"only sandboxes in one of these states: running, paused"`
	Limit    int               `json:"limit,omitempty" jsonschema:"most sandboxes to return, 1 to 1000; default 100"`
	Cursor   string            `json:"cursor,omitempty" jsonschema:"next_cursor of the previous page"`
}

func (listIn) sandbox() string { return "" }

type listOut struct {
	Sandboxes  []sandboxOut `json:"sandboxes"`
	NextCursor string       `json:"next_cursor,omitempty" jsonschema:"present when there are more: pass it as cursor"`
}

func (s *Server) list(ctx context.Context, _ *sdk.CallToolRequest, in listIn) (listOut, error) {
	if in.Limit < 0 || in.Limit > 1000 {
		return listOut{}, errdefs.New(errdefs.ErrInvalidArgument, "limit must be between 1 and 1000")
	}
	f := sandbox.ListFilter{Metadata: in.Metadata, Cursor: in.Cursor, Limit: in.Limit, Order: sandbox.OrderDesc}
	if f.Limit == 0 {
		f.Limit = 100
	}
	for _, st := range in.State {
		if !sandbox.State(st).Live() {
			return listOut{}, errdefs.New(errdefs.ErrInvalidArgument, "unknown state "+st+": want running or paused")
		}
		f.States = append(f.States, sandbox.State(st))
		if st == string(sandbox.StatePaused) {
			f.States = append(f.States, sandbox.StateResuming) // reported as paused
		}
	}
	vs, next, err := s.cfg.Sandboxes.ListViews(ctx, f)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalidFilter) {
			err = errdefs.New(errdefs.ErrInvalidArgument, "invalid cursor")
		}
		return listOut{}, err
	}
	out := listOut{Sandboxes: make([]sandboxOut, 0, len(vs)), NextCursor: next}
	for _, v := range vs {
		out.Sandboxes = append(out.Sandboxes, sandboxOf(v))
	}
	return out, nil
}

var killTool = &sdk.Tool{
	Name:        "sandbox_kill",
	Description: "Kill a sandbox: its processes stop and its filesystem is deleted. It cannot be undone.",
	Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
}

type idIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, from sandbox_create or sandbox_list"`
}

func (in idIn) sandbox() string { return in.SandboxID }

type killOut struct {
	SandboxID string `json:"sandbox_id"`
	Killed    bool   `json:"killed"`
}

func (s *Server) kill(ctx context.Context, _ *sdk.CallToolRequest, in idIn) (killOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return killOut{}, err
	}
	if err := s.cfg.Sandboxes.Kill(ctx, in.SandboxID); err != nil {
		return killOut{}, err
	}
	return killOut{SandboxID: in.SandboxID, Killed: true}, nil
}

func requireID(id string) error {
	if id == "" {
		return errdefs.New(errdefs.ErrInvalidArgument, "missing sandbox_id")
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
