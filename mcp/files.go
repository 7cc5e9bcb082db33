package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/server/native"
)

// Files go through envd's /files (read, write) and its Filesystem service
// (list), as the native API's do.

const (
	readDefault = 256 << 10
	readMax     = 4 << 20
	// listMax bounds the entries sandbox_list_files returns.
	listMax = 1000
)

var writeFileTool = &sdk.Tool{
	Name: "sandbox_write_file",
	Description: "Write a file in a sandbox, replacing it if it exists and creating missing parent directories. " +
		"content is text (UTF-8) unless encoding is base64 (for binary files). A relative path is relative to the " +
		"user's home (/home/user); the file belongs to that user.",
	Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
}

type writeFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, from sandbox_create or sandbox_list"`
	Path      string `json:"path" jsonschema:"the file's path, e.g. /home/user/main.py"`
	Content   string `json:"content" jsonschema:"the file's content: text, or base64 when encoding is base64"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	User      string `json:"user,omitempty" jsonschema:"user to write as: user (default) or root"`
}

func (in writeFileIn) sandbox() string { return in.SandboxID }

type writeFileOut struct {
	Path  string `json:"path" jsonschema:"the file's absolute path"`
	Bytes int    `json:"bytes" jsonschema:"bytes written"`
}

func (s *Server) writeFile(ctx context.Context, _ *sdk.CallToolRequest, in writeFileIn) (writeFileOut, error) {
	if err := requirePath(in.SandboxID, in.Path); err != nil {
		return writeFileOut{}, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return writeFileOut{}, errdefs.New(errdefs.ErrInvalidArgument, "content is not base64: "+err.Error())
		}
	default:
		return writeFileOut{}, errdefs.New(errdefs.ErrInvalidArgument, "encoding must be text or base64, not "+strconv.Quote(in.Encoding))
	}
	resp, done, err := s.files(ctx, in.SandboxID, in.User, http.MethodPost, in.Path, data)
	if err != nil {
		return writeFileOut{}, err
	}
	defer done()
	var entries []struct{ Path string }
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&entries); err != nil || len(entries) == 0 {
		return writeFileOut{}, errdefs.New(errdefs.ErrUnavailable, "envd answered the upload without an entry")
	}
	return writeFileOut{Path: entries[0].Path, Bytes: len(data)}, nil
}

var readFileTool = &sdk.Tool{
	Name: "sandbox_read_file",
	Description: "Read a file in a sandbox. A text (UTF-8) file comes back as text, any other as base64 " +
		"(encoding says which). At most max_bytes are read (default 256 KiB, at most 4 MiB): truncated is true " +
		"when the file is longer; size is its whole length.",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type readFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, from sandbox_create or sandbox_list"`
	Path      string `json:"path" jsonschema:"the file's path; a relative one is relative to /home/user"`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"most bytes to read from the start of the file; default 262144, at most 4194304"`
	User      string `json:"user,omitempty" jsonschema:"user to read as: user (default) or root"`
}

func (in readFileIn) sandbox() string { return in.SandboxID }

type readFileOut struct {
	Path      string `json:"path"`
	Encoding  string `json:"encoding" jsonschema:"text or base64"`
	Content   string `json:"content"`
	Size      int64  `json:"size" jsonschema:"the file's length in bytes (-1 if envd did not say)"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"true when only the first max_bytes were read"`
}

func (s *Server) readFile(ctx context.Context, _ *sdk.CallToolRequest, in readFileIn) (readFileOut, error) {
	if err := requirePath(in.SandboxID, in.Path); err != nil {
		return readFileOut{}, err
	}
	limit := in.MaxBytes
	switch {
	case limit < 0 || limit > readMax:
		return readFileOut{}, errdefs.New(errdefs.ErrInvalidArgument, "max_bytes must be between 1 and "+strconv.Itoa(readMax))
	case limit == 0:
		limit = readDefault
	}
	resp, done, err := s.files(ctx, in.SandboxID, in.User, http.MethodGet, in.Path, nil)
	if err != nil {
		return readFileOut{}, err
	}
	defer done()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return readFileOut{}, errdefs.New(errdefs.ErrUnavailable, "reading the file from envd: "+err.Error())
	}
	out := readFileOut{Path: in.Path, Size: resp.ContentLength}
	if len(data) > limit {
		data, out.Truncated = data[:limit], true
	}
	text := data
	if out.Truncated {
		text = trimRuneEnd(data) // a cut may split a character
	}
	if utf8.Valid(text) && bytes.IndexByte(text, 0) < 0 {
		out.Encoding, out.Content = "text", string(text)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	return out, nil
}

// files sends one request to envd's /files of sandbox id as user; on
// success the answer is 200 and done closes it and ends the activity.
func (s *Server) files(ctx context.Context, id, user, method, path string, body []byte) (*http.Response, func(), error) {
	c, done, err := s.cfg.Envd.Envd(ctx, id, user)
	if err != nil {
		return nil, nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	resp, err := c.Files(ctx, method, path, rd, int64(len(body)))
	if err != nil {
		done()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		err := native.EnvdStatus(resp)
		resp.Body.Close()
		done()
		return nil, nil, err
	}
	return resp, func() { resp.Body.Close(); done() }, nil
}

var listFilesTool = &sdk.Tool{
	Name: "sandbox_list_files",
	Description: "List a directory in a sandbox: each entry's name, path, type (file, dir, symlink, other), size, " +
		"mode and modification time. depth 1 (default) lists the directory itself, 2 also its subdirectories, " +
		"and so on. At most 1000 entries are returned (truncated: true when there were more).",
	Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
}

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, from sandbox_create or sandbox_list"`
	Path      string `json:"path" jsonschema:"the directory; a relative one is relative to /home/user"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to descend, 1 to 64; default 1"`
	User      string `json:"user,omitempty" jsonschema:"user to list as: user (default) or root"`
}

func (in listFilesIn) sandbox() string { return in.SandboxID }

type fileEntry struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	Type       string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size       int64  `json:"size"`
	Mode       string `json:"mode,omitempty" jsonschema:"permissions, e.g. -rw-r--r--"`
	ModifiedAt string `json:"modified_at,omitempty" jsonschema:"RFC 3339"`
}

type listFilesOut struct {
	Entries   []fileEntry `json:"entries"`
	Truncated bool        `json:"truncated,omitempty"`
}

func (s *Server) listFiles(ctx context.Context, _ *sdk.CallToolRequest, in listFilesIn) (listFilesOut, error) {
	if err := requirePath(in.SandboxID, in.Path); err != nil {
		return listFilesOut{}, err
	}
	depth := in.Depth
	switch {
	case depth < 0 || depth > 64:
		return listFilesOut{}, errdefs.New(errdefs.ErrInvalidArgument, "depth must be between 1 and 64")
	case depth == 0:
		depth = 1
	}
	c, done, err := s.cfg.Envd.Envd(ctx, in.SandboxID, in.User)
	if err != nil {
		return listFilesOut{}, err
	}
	defer done()
	resp, err := listDir(ctx, c, in.Path, depth)
	if err != nil {
		return listFilesOut{}, err
	}
	out := listFilesOut{Entries: []fileEntry{}}
	for _, e := range resp {
		if len(out.Entries) == listMax {
			out.Truncated = true
			break
		}
		fe := fileEntry{Name: e.GetName(), Path: e.GetPath(), Size: e.GetSize(), Mode: e.GetPermissions(),
			Type: native.EntryType(e.GetType())}
		if t := e.GetModifiedTime(); t != nil {
			fe.ModifiedAt = t.AsTime().UTC().Format(time.RFC3339)
		}
		out.Entries = append(out.Entries, fe)
	}
	return out, nil
}

func listDir(ctx context.Context, c *envdconn.Client, path string, depth int) ([]*filesystem.EntryInfo, error) {
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: uint32(depth)})
	c.Auth(req.Header())
	resp, err := c.Filesystem().ListDir(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetEntries(), nil
}

func requirePath(id, path string) error {
	if err := requireID(id); err != nil {
		return err
	}
	if path == "" {
		return errdefs.New(errdefs.ErrInvalidArgument, "missing path")
	}
	return nil
}
