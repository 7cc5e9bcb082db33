package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/workspace"
)

// Workspace is a sandbox's work as the workspace tools use it
// (*workspace.Service): its changes, their patch, their export, their
// publication, and the versions of its template.
type Workspace interface {
	Changes(ctx context.Context, id string) (workspace.ChangeList, error)
	Diff(ctx context.Context, id string, w io.Writer) error
	ExportPatch(ctx context.Context, id string, w io.Writer, finalize bool) error
	Export(ctx context.Context, id string, w io.Writer, finalize bool) error
	Publish(ctx context.Context, id, target string, finalize bool) (template.Version, error)
	Versions(ctx context.Context, id string) ([]template.Version, string, error)
}

// Bounds of what the workspace tools put in an answer: sandbox_changes
// and sandbox_diff cut theirs and say so; sandbox_export, whose answer is
// the whole record, refuses a larger one.
const (
	maxChangesOut = 1000
	maxPatchOut   = 256 << 10
	maxExportOut  = 1 << 20
)

var changesTool = &sdk.Tool{
	Name: "sandbox_changes",
	Description: "List what a sandbox changed in its filesystem compared with the template it was created from: " +
		"added, modified and deleted paths (a directory that only holds changes is not listed itself). " +
		"opaque marks a directory that was removed and made again: nothing of the template's is left in it. " +
		"A path that is not valid UTF-8 is shown with U+FFFD in place of its odd bytes, and path_base64 has its exact bytes. " +
		"Where the server records it, writer names the process that last wrote a path (pid, comm, command, and envd_pid: " +
		"the command started through the sandbox's process API it belongs to). " +
		"Use it to review an agent's work before sandbox_diff, sandbox_export or sandbox_publish.",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type changeOut struct {
	Path       string `json:"path" jsonschema:"the absolute path, each byte that is not UTF-8 replaced by U+FFFD"`
	PathBase64 string `json:"path_base64,omitempty" jsonschema:"the path's exact bytes in base64, when it is not valid UTF-8"`
	Kind       string `json:"kind" jsonschema:"added, modified or deleted"`
	Type       string `json:"type,omitempty" jsonschema:"file, dir, symlink or other (absent for a deletion)"`
	Size       int64  `json:"size,omitempty" jsonschema:"a file's size in bytes"`
	Opaque     bool   `json:"opaque,omitempty" jsonschema:"a directory that replaced the template's: nothing of what the template had in it is left"`

	// Writer is the native API's ChangeWriter.
	Writer *writerOut `json:"writer,omitempty" jsonschema:"the process that last created, renamed, changed the attributes of or wrote it, where recorded"`
}

type writerOut struct {
	PID     int    `json:"pid" jsonschema:"its pid in the sandbox"`
	Comm    string `json:"comm" jsonschema:"its kernel name, such as python3"`
	Command string `json:"command,omitempty" jsonschema:"its argv joined by spaces, cut at 256 bytes; absent when it had exited"`
	EnvdPID int    `json:"envd_pid,omitempty" jsonschema:"the pid of the command started through the process API (sandbox_exec) it is or descends from; absent for envd itself (a file write through the API)"`
}

type changesOut struct {
	SandboxID string      `json:"sandbox_id"`
	Changes   []changeOut `json:"changes"`
	Total     int         `json:"total" jsonschema:"how many changes there are; more than listed when the list was cut"`
	Note      string      `json:"note,omitempty"`
	// WritersTruncated: see the native API's ChangeList.
	WritersTruncated bool `json:"writers_truncated,omitempty" jsonschema:"the server's record of writers is incomplete: a change without a writer may have had one"`
}

func (o changesOut) sandbox() string { return o.SandboxID }

func (s *Server) changes(ctx context.Context, _ *sdk.CallToolRequest, in idIn) (changesOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return changesOut{}, err
	}
	list, err := s.cfg.Workspace.Changes(ctx, in.SandboxID)
	if err != nil {
		return changesOut{}, err
	}
	chs := list.Changes
	out := changesOut{SandboxID: in.SandboxID, Changes: []changeOut{}, Total: len(chs), WritersTruncated: list.WritersTruncated}
	for i, c := range chs {
		if i == maxChangesOut {
			out.Note = fmt.Sprintf("only the first %d of %d changes are listed", maxChangesOut, len(chs))
			break
		}
		text, raw := native.ChangePath(c)
		co := changeOut{Path: text, PathBase64: raw, Kind: string(c.Kind), Size: c.Size, Opaque: c.Opaque}
		if c.Kind != runtime.ChangeDeleted {
			co.Type = native.ChangeType(c)
		}
		if w := c.Writer; w != nil {
			co.Writer = &writerOut{PID: w.PID, Comm: w.Comm, Command: w.Command, EnvdPID: w.EnvdPID}
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

var exportTool = &sdk.Tool{
	Name: "sandbox_export",
	Description: "Export all of a sandbox's changes against the template it was created from. format \"patch\" (the default) " +
		"is the git-style patch of sandbox_diff, as text: git apply takes it. format \"tar\" is an OCI image layer of " +
		"every change (files, directories, symlinks, modes; deletions as .wh. whiteouts), base64-encoded. An export is " +
		"never cut: one larger than 1 MiB (before base64) is refused with a resource_exhausted error, and the sandbox is " +
		"not finalized; the native API's GET /v1/sandboxes/{id}/export (tar) and /diff (patch) stream any size. " +
		"With finalize, the sandbox is killed once the export is made.",
	Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(false)},
}

type exportIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox whose changes to export"`
	Format    string `json:"format,omitempty" jsonschema:"patch (the default) or tar"`
	Finalize  bool   `json:"finalize,omitempty" jsonschema:"kill the sandbox once the export is made"`
}

func (in exportIn) sandbox() string { return in.SandboxID }

type exportOut struct {
	SandboxID string `json:"sandbox_id"`
	Format    string `json:"format" jsonschema:"patch or tar"`
	Encoding  string `json:"encoding" jsonschema:"text for a patch, base64 for a tar"`
	Content   string `json:"content"`
	Bytes     int    `json:"bytes" jsonschema:"the export's size in bytes, before base64"`
	Finalized bool   `json:"finalized" jsonschema:"whether the sandbox was killed after the export"`
}

func (o exportOut) sandbox() string { return o.SandboxID }

func (s *Server) export(ctx context.Context, _ *sdk.CallToolRequest, in exportIn) (exportOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return exportOut{}, err
	}
	w := &capWriter{max: maxExportOut}
	var err error
	switch in.Format {
	case "", "patch":
		in.Format = "patch"
		err = s.cfg.Workspace.ExportPatch(ctx, in.SandboxID, w, in.Finalize)
	case "tar":
		err = s.cfg.Workspace.Export(ctx, in.SandboxID, w, in.Finalize)
	default:
		return exportOut{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("format %q: want patch or tar", in.Format))
	}
	if w.over {
		// Whatever the backend made of the refused write: the export
		// stopped there, and nothing was finalized.
		return exportOut{}, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf(
			"the %s is larger than %d bytes, the most sandbox_export answers with; nothing was finalized. "+
				"Fetch it from the native API (GET /v1/sandboxes/%s/%s), which streams any size",
			in.Format, maxExportOut, in.SandboxID, map[string]string{"patch": "diff", "tar": "export"}[in.Format]))
	}
	if err != nil {
		return exportOut{}, err
	}
	out := exportOut{SandboxID: in.SandboxID, Format: in.Format, Encoding: "text", Content: string(w.buf),
		Bytes: len(w.buf), Finalized: in.Finalize}
	if in.Format == "tar" {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(w.buf)
	}
	return out, nil
}

// capWriter keeps what is written up to max bytes, and refuses the write
// that would pass it.
type capWriter struct {
	buf  []byte
	max  int
	over bool
}

func (w *capWriter) Write(p []byte) (int, error) {
	if len(w.buf)+len(p) > w.max {
		w.over = true
		return 0, errdefs.New(errdefs.ErrResourceExhausted, "export too large")
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

var versionsTool = &sdk.Tool{
	Name: "template_versions",
	Description: "List the versions of the template a sandbox was created from, newest first: each version's number, " +
		"its build_id (which sandbox_create's template can name to start from exactly that version), the build it was " +
		"published from, the sandbox that published it, how many paths it changed, and whether it is current (what new " +
		"sandboxes of the template start from). started_from is the build the sandbox itself started from: when a newer " +
		"version is current, sandbox_publish may find conflicts. A sandbox of a built-in template has no versions.",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type versionOut struct {
	TemplateID string `json:"template_id"`
	Template   string `json:"template" jsonschema:"the template's name"`
	Version    int    `json:"version" jsonschema:"the version's number, 1 for a template's first"`
	BuildID    string `json:"build_id" jsonschema:"what sandbox_create's template can name to start from exactly this version"`
	Parent     string `json:"parent,omitempty" jsonschema:"the build a published version was made from; absent for a build of steps or a snapshot"`
	Sandbox    string `json:"sandbox,omitempty" jsonschema:"the sandbox that published this version; absent for a build"`
	Paths      int    `json:"paths" jsonschema:"how many paths the version changed"`
	Current    bool   `json:"current" jsonschema:"new sandboxes of the template start from this version"`
	CreatedAt  string `json:"created_at" jsonschema:"RFC 3339"`
}

type versionsOut struct {
	SandboxID   string       `json:"sandbox_id"`
	StartedFrom string       `json:"started_from" jsonschema:"the build (or built-in template) the sandbox was created from"`
	Versions    []versionOut `json:"versions"`
}

func (o versionsOut) sandbox() string { return o.SandboxID }

func (s *Server) versions(ctx context.Context, _ *sdk.CallToolRequest, in idIn) (versionsOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return versionsOut{}, err
	}
	vs, from, err := s.cfg.Workspace.Versions(ctx, in.SandboxID)
	if err != nil {
		return versionsOut{}, err
	}
	out := versionsOut{SandboxID: in.SandboxID, StartedFrom: from, Versions: make([]versionOut, 0, len(vs))}
	for _, v := range vs {
		out.Versions = append(out.Versions, versionOut{TemplateID: v.TemplateID, Template: v.Template, Version: v.Number,
			BuildID: v.BuildID, Parent: v.Parent, Sandbox: v.Sandbox, Paths: v.Paths, Current: v.Current,
			CreatedAt: v.CreatedAt.UTC().Format(time.RFC3339)})
	}
	return out, nil
}
