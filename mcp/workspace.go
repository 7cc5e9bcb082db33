package mcp

import (
	"context"
	"fmt"
	"io"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/template"
)

// Workspace is a sandbox's work as the workspace tools use it
// (*workspace.Service): its changes, their patch, their publication.
type Workspace interface {
	Changes(ctx context.Context, id string) ([]runtime.Change, error)
	Diff(ctx context.Context, id string, w io.Writer) error
	Publish(ctx context.Context, id, target string, finalize bool) (template.Version, error)
}

// Bounds of what the workspace tools put in an answer.
const (
	maxChangesOut = 1000
	maxPatchOut   = 256 << 10
)

var changesTool = &sdk.Tool{
	Name: "sandbox_changes",
	Description: "List what a sandbox changed in its filesystem compared with the template it was created from: " +
		"added, modified and deleted paths (a directory that only holds changes is not listed itself). " +
		"Use it to review an agent's work before sandbox_diff or sandbox_publish.",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type changeOut struct {
	Path string `json:"path"`
	Kind string `json:"kind" jsonschema:"added, modified or deleted"`
	Type string `json:"type,omitempty" jsonschema:"file, dir, symlink or other (absent for a deletion)"`
	Size int64  `json:"size,omitempty" jsonschema:"a file's size in bytes"`
}

type changesOut struct {
	SandboxID string      `json:"sandbox_id"`
	Changes   []changeOut `json:"changes"`
	Total     int         `json:"total" jsonschema:"how many changes there are; more than listed when the list was cut"`
	Note      string      `json:"note,omitempty"`
}

func (o changesOut) sandbox() string { return o.SandboxID }

func (s *Server) changes(ctx context.Context, _ *sdk.CallToolRequest, in idIn) (changesOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return changesOut{}, err
	}
	chs, err := s.cfg.Workspace.Changes(ctx, in.SandboxID)
	if err != nil {
		return changesOut{}, err
	}
	out := changesOut{SandboxID: in.SandboxID, Changes: []changeOut{}, Total: len(chs)}
	for i, c := range chs {
		if i == maxChangesOut {
			out.Note = fmt.Sprintf("only the first %d of %d changes are listed", maxChangesOut, len(chs))
			break
		}
		co := changeOut{Path: strings.ToValidUTF8(c.Path, "\uFFFD"), Kind: string(c.Kind), Size: c.Size}
		if c.Kind != runtime.ChangeDeleted {
			co.Type = native.ChangeType(c)
		}
		out.Changes = append(out.Changes, co)
	}
	return out, nil
}

var diffTool = &sdk.Tool{
	Name: "sandbox_diff",
	Description: "Show a sandbox's changes to regular files as a git-style unified patch (git apply takes it), " +
		"against the template it was created from. Binary and very large files are named without their lines.",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type diffOut struct {
	SandboxID string `json:"sandbox_id"`
	Patch     string `json:"patch"`
	Note      string `json:"note,omitempty"`
}

func (o diffOut) sandbox() string { return o.SandboxID }

func (s *Server) diff(ctx context.Context, _ *sdk.CallToolRequest, in idIn) (diffOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return diffOut{}, err
	}
	var b strings.Builder
	if err := s.cfg.Workspace.Diff(ctx, in.SandboxID, &b); err != nil {
		return diffOut{}, err
	}
	out := diffOut{SandboxID: in.SandboxID, Patch: b.String()}
	if len(out.Patch) > maxPatchOut {
		cut := strings.ToValidUTF8(out.Patch[:maxPatchOut], "")
		out.Note = fmt.Sprintf("the patch was cut after %d of its %d bytes; the native API's /diff has all of it", len(cut), len(out.Patch))
		out.Patch = cut
	}
	return out, nil
}

var publishTool = &sdk.Tool{
	Name: "sandbox_publish",
	Description: "Make a sandbox's changes the next version of a template, so that new sandboxes of it start with them. " +
		"By default the template is the one the sandbox was created from; name one to publish a sandbox of a built-in " +
		"template. If versions published since this sandbox started changed any of the same paths, nothing is published " +
		"and the error lists the conflicting paths: start a new sandbox from the newest version and redo the work there.",
	Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(false)},
}

type publishIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox whose changes to publish"`
	Template  string `json:"template,omitempty" jsonschema:"the template to publish to; default the one the sandbox was created from"`
	Finalize  bool   `json:"finalize,omitempty" jsonschema:"kill the sandbox once the version is made"`
}

func (in publishIn) sandbox() string { return in.SandboxID }

type publishOut struct {
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	Version   int    `json:"version" jsonschema:"the version's number, 1 for a template's first"`
	BuildID   string `json:"build_id" jsonschema:"what sandbox_create's template can name to start from exactly this version"`
	Paths     int    `json:"paths" jsonschema:"how many paths the version changed"`
}

func (o publishOut) sandbox() string { return o.SandboxID }

func (s *Server) publish(ctx context.Context, _ *sdk.CallToolRequest, in publishIn) (publishOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return publishOut{}, err
	}
	v, err := s.cfg.Workspace.Publish(ctx, in.SandboxID, in.Template, in.Finalize)
	if err != nil {
		return publishOut{}, err
	}
	return publishOut{SandboxID: in.SandboxID, Template: v.Template, Version: v.Number, BuildID: v.BuildID, Paths: v.Paths}, nil
}
