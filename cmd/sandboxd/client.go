package main

// `sandboxd sandbox ...`: a client of the native API (/v1/sandboxes) of a
// running sandboxd.
//
//	sandboxd sandbox create [--template T] [--timeout 300] [--env K=V]... [--metadata K=V]... [--memory-mb N] [--cpu N] [--disk-mb N]
//	sandboxd sandbox list [--json]
//	sandboxd sandbox get ID
//	sandboxd sandbox rm ID...
//	sandboxd sandbox exec [-i] [-t] [--user U] [--cwd DIR] [--env K=V]... ID -- CMD [ARGS...]
//	sandboxd sandbox shell [--user U] ID
//	sandboxd sandbox cp SRC DST         (one of them ID:PATH; "-" is stdin or stdout)
//
// Every subcommand takes --url and --token (SANDBOXD_URL, SANDBOXD_TOKEN);
// the token is a JWT from `sandboxd token create` or an API key.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/server/nativews"
)

// exitError carries a remote exit code out to main.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// sandboxCmd runs a `sandbox` subcommand on the process's stdio and exits
// with a remote command's exit code.
func sandboxCmd(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := runSandboxCmd(ctx, args, clientIO{in: os.Stdin, out: os.Stdout, errOut: os.Stderr})
	var ee exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	return err
}

type clientIO struct {
	in          io.Reader
	out, errOut io.Writer
}

// kvFlag collects repeated K=V flags.
type kvFlag map[string]string

func (k kvFlag) String() string { return "" }
func (k kvFlag) Set(s string) error {
	key, v, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	k[key] = v
	return nil
}

// apiClient talks to one sandboxd's native API.
type apiClient struct {
	base  string // http://host:port, no trailing slash
	token string
	http  *http.Client
}

func clientFlags(name string) (*flag.FlagSet, *string, *string) {
	fs := flag.NewFlagSet("sandbox "+name, flag.ContinueOnError)
	u := fs.String("url", "http://127.0.0.1:3000", "sandboxd URL (env SANDBOXD_URL)")
	tok := fs.String("token", "", "JWT or API key (env SANDBOXD_TOKEN)")
	return fs, u, tok
}

func newAPIClient(rawURL, token string) (*apiClient, error) {
	if token == "" {
		return nil, errors.New("no token: pass --token or set SANDBOXD_TOKEN (sandboxd token create)")
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q: want http(s)://host:port", rawURL)
	}
	return &apiClient{base: strings.TrimSuffix(rawURL, "/"), token: token, http: &http.Client{}}, nil
}

// do sends a request; a non-2xx answer becomes an error with the server's
// message.
func (c *apiClient) do(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+"/v1/sandboxes"+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, apiError(resp)
	}
	return resp, nil
}

func apiError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e nativeapi.Error
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return fmt.Errorf("%s: %s", e.Error.Code, e.Error.Message)
	}
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
}

func (c *apiClient) json(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(raw), "application/json"
	}
	resp, err := c.do(ctx, method, path, body, ct)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func runSandboxCmd(ctx context.Context, args []string, cio clientIO) error {
	if len(args) == 0 {
		return errors.New("sandbox: want create, list, get, rm, exec, shell, cp, changes, diff, export, publish or versions")
	}
	sub, args := args[0], args[1:]
	fs, rawURL, token := clientFlags(sub)
	fs.SetOutput(cio.errOut)
	var run func(c *apiClient) error
	switch sub {
	case "create":
		var (
			template = fs.String("template", "", "template (default base)")
			timeout  = fs.Int("timeout", 0, "lifetime in seconds (0 = server default)")
			cpu      = fs.Int("cpu", 0, "vCPUs")
			mem      = fs.Int("memory-mb", 0, "memory limit in MiB")
			disk     = fs.Int("disk-mb", 0, "disk size in MiB")
			noNet    = fs.Bool("no-internet", false, "no outbound internet")
			asJSON   = fs.Bool("json", false, "print the sandbox as JSON, not just its id")
			env      = kvFlag{}
			meta     = kvFlag{}
		)
		fs.Var(env, "env", "KEY=VALUE sandbox environment (repeatable)")
		fs.Var(meta, "metadata", "KEY=VALUE label (repeatable)")
		run = func(c *apiClient) error {
			body := nativeapi.SandboxPost{}
			if *template != "" {
				body.Template = template
			}
			if *timeout != 0 {
				body.Timeout = timeout
			}
			if *cpu != 0 {
				body.CpuCount = cpu
			}
			if *mem != 0 {
				body.MemoryMb = mem
			}
			if *disk != 0 {
				body.DiskMb = disk
			}
			if *noNet {
				f := false
				body.AllowInternet = &f
			}
			if len(env) > 0 {
				m := map[string]string(env)
				body.Env = &m
			}
			if len(meta) > 0 {
				m := map[string]string(meta)
				body.Metadata = &m
			}
			var sb nativeapi.Sandbox
			if err := c.json(ctx, http.MethodPost, "", body, &sb); err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cio.out, sb)
			}
			_, err := fmt.Fprintln(cio.out, sb.Id)
			return err
		}
	case "list":
		asJSON := fs.Bool("json", false, "print JSON")
		run = func(c *apiClient) error {
			var all []nativeapi.Sandbox
			cursor := ""
			for {
				q := ""
				if cursor != "" {
					q = "?cursor=" + url.QueryEscape(cursor)
				}
				var page nativeapi.SandboxList
				if err := c.json(ctx, http.MethodGet, q, nil, &page); err != nil {
					return err
				}
				all = append(all, page.Sandboxes...)
				if page.NextCursor == nil {
					break
				}
				cursor = *page.NextCursor
			}
			if *asJSON {
				return printJSON(cio.out, all)
			}
			tw := tabwriter.NewWriter(cio.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tSTARTED\tEND")
			for _, sb := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.Id, sb.Template, sb.State,
					sb.StartedAt.Local().Format(time.DateTime), sb.EndAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		}
	case "get":
		run = func(c *apiClient) error {
			id, err := oneID(fs.Args())
			if err != nil {
				return err
			}
			var sb nativeapi.Sandbox
			if err := c.json(ctx, http.MethodGet, "/"+url.PathEscape(id), nil, &sb); err != nil {
				return err
			}
			return printJSON(cio.out, sb)
		}
	case "rm":
		run = func(c *apiClient) error {
			if fs.NArg() == 0 {
				return errors.New("rm: want at least one sandbox id")
			}
			var errs []error
			for _, id := range fs.Args() {
				if err := c.json(ctx, http.MethodDelete, "/"+url.PathEscape(id), nil, nil); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
					continue
				}
				fmt.Fprintln(cio.out, id)
			}
			return errors.Join(errs...)
		}
	case "exec":
		var (
			interactive = fs.Bool("i", false, "forward stdin")
			tty         = fs.Bool("t", false, "allocate a PTY (raw mode when stdin is a terminal)")
			user        = fs.String("user", "", "user to run as (default: the sandbox's)")
			cwd         = fs.String("cwd", "", "working directory")
			timeout     = fs.Int("timeout", 0, "kill the command after this many seconds (0 = never)")
			env         = kvFlag{}
		)
		fs.Var(env, "env", "KEY=VALUE for the command (repeatable)")
		run = func(c *apiClient) error {
			args := fs.Args()
			if len(args) < 2 {
				return errors.New("exec: want ID -- CMD [ARGS...]")
			}
			id, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return errors.New("exec: no command")
			}
			start := nativews.Frame{Type: nativews.TypeStart, Argv: argv, Env: env, Cwd: *cwd, User: *user, Timeout: *timeout}
			return c.stream(ctx, id, start, cio, *interactive || *tty, *tty)
		}
	case "shell":
		user := fs.String("user", "", "user to run as (default: the sandbox's)")
		run = func(c *apiClient) error {
			id, err := oneID(fs.Args())
			if err != nil {
				return err
			}
			start := nativews.Frame{Type: nativews.TypeStart, Cmd: "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi",
				User: *user, Env: map[string]string{"TERM": termEnv()}}
			return c.stream(ctx, id, start, cio, true, true)
		}
	case "cp":
		user := fs.String("user", "", "user owning the sandbox side (default: the sandbox's)")
		run = func(c *apiClient) error {
			if fs.NArg() != 2 {
				return errors.New("cp: want SRC DST, one of them ID:PATH")
			}
			return c.copy(ctx, fs.Arg(0), fs.Arg(1), *user, cio)
		}
	case "changes", "versions":
		run = func(c *apiClient) error {
			id, err := oneID(fs.Args())
			if err != nil {
				return err
			}
			var out any
			if err := c.json(ctx, http.MethodGet, "/"+url.PathEscape(id)+"/"+sub, nil, &out); err != nil {
				return err
			}
			return printJSON(cio.out, out)
		}
	case "diff", "export":
		output := fs.String("o", "-", "write to this file (- is stdout)")
		finalize := fs.Bool("finalize", false, "export: kill the sandbox once the export is complete")
		writers := fs.Bool("writers", false, "diff: a comment line before each file's section naming the process that wrote it, where the server records writers (serve --local-track-writers); git apply skips it")
		run = func(c *apiClient) error {
			id, err := oneID(fs.Args())
			if err != nil {
				return err
			}
			path := "/" + url.PathEscape(id) + "/" + sub
			if sub == "export" && *finalize {
				path += "?finalize=true"
			}
			var filter func(io.Writer) io.Writer
			if sub == "diff" && *writers {
				var cl nativeapi.ChangeList
				if err := c.json(ctx, http.MethodGet, "/"+url.PathEscape(id)+"/changes", nil, &cl); err != nil {
					return err
				}
				filter = func(w io.Writer) io.Writer { return newWriterNotes(w, cl) }
			}
			return c.download(ctx, path, *output, cio.out, filter)
		}
	case "publish":
		template := fs.String("template", "", "template to publish to (default: the one the sandbox was created from)")
		finalize := fs.Bool("finalize", false, "kill the sandbox once the version is made")
		run = func(c *apiClient) error {
			id, err := oneID(fs.Args())
			if err != nil {
				return err
			}
			body := nativeapi.PublishPost{Finalize: finalize}
			if *template != "" {
				body.Template = template
			}
			var v nativeapi.Version
			if err := c.json(ctx, http.MethodPost, "/"+url.PathEscape(id)+"/publish", body, &v); err != nil {
				return err
			}
			return printJSON(cio.out, v)
		}
	default:
		return fmt.Errorf("sandbox: unknown subcommand %q", sub)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Only --url and --token come from the environment: a stray
	// SANDBOXD_USER must not change what a command runs as.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if v, ok := os.LookupEnv("SANDBOXD_URL"); ok && !set["url"] {
		*rawURL = v
	}
	if v, ok := os.LookupEnv("SANDBOXD_TOKEN"); ok && !set["token"] {
		*token = v
	}
	c, err := newAPIClient(*rawURL, *token)
	if err != nil {
		return err
	}
	return run(c)
}

func oneID(args []string) (string, error) {
	if len(args) != 1 {
		return "", errors.New("want exactly one sandbox id")
	}
	return args[0], nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func termEnv() string {
	if t := os.Getenv("TERM"); t != "" {
		return t
	}
	return "xterm-256color"
}

// remotePath splits "ID:PATH"; ok is false for a local path.
func remotePath(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || id == "" || strings.ContainsAny(id, "/.") || path == "" {
		return "", "", false
	}
	return id, path, true
}

// copy streams a file into or out of a sandbox.
func (c *apiClient) copy(ctx context.Context, src, dst, user string, cio clientIO) error {
	sid, spath, sRemote := remotePath(src)
	did, dpath, dRemote := remotePath(dst)
	q := func(p string) string {
		v := url.Values{"path": {p}}
		if user != "" {
			v.Set("user", user)
		}
		return "?" + v.Encode()
	}
	switch {
	case sRemote == dRemote:
		return errors.New("cp: exactly one of SRC and DST must be ID:PATH")
	case dRemote: // upload
		var body io.Reader = cio.in
		var size int64 = -1
		if src != "-" {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			if st.IsDir() {
				return fmt.Errorf("cp: %s is a directory (copy files one at a time, or tar them)", src)
			}
			body, size = f, st.Size()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/v1/sandboxes/"+url.PathEscape(did)+"/files"+q(dpath), body)
		if err != nil {
			return err
		}
		req.ContentLength = size
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return apiError(resp)
		}
		return nil
	default: // download
		resp, err := c.do(ctx, http.MethodGet, "/"+url.PathEscape(sid)+"/files"+q(spath), nil, "")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if dst == "-" {
			_, err = io.Copy(cio.out, resp.Body)
			return err
		}
		if st, err := os.Stat(dst); err == nil && st.IsDir() {
			dst = strings.TrimSuffix(dst, "/") + "/" + baseName(spath)
		}
		tmp := dst + ".sandboxd-cp"
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			os.Remove(tmp)
			return err
		}
		if err := f.Close(); err != nil {
			os.Remove(tmp)
			return err
		}
		return os.Rename(tmp, dst)
	}
}

func baseName(p string) string {
	p = strings.TrimSuffix(p, "/")
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

// download streams the answer of GET path to the file named output (-:
// stdout); a cut answer is an error, and a partly written file is removed.
func (c *apiClient) download(ctx context.Context, path, output string, stdout io.Writer, filter func(io.Writer) io.Writer) (err error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	w := stdout
	if output != "-" {
		f, err := os.Create(output)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				_ = os.Remove(output)
			}
		}()
		w = f
	}
	if filter != nil {
		w = filter(w)
	}
	if _, err = io.Copy(w, resp.Body); err != nil {
		return err
	}
	if f, ok := w.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}
