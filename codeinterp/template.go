package codeinterp

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// TemplateName is the template E2B's code-interpreter SDKs create their
// sandboxes from.
const TemplateName = "code-interpreter-v1"

// Dir is where the template keeps the server, its start script, the
// IPython profile and the Python venv with Jupyter.
const Dir = "/opt/sandboxd/code-interpreter"

// Packages are what the template's venv holds, from PyPI, pinned so that
// a rebuild makes the same template (and the layer cache keeps it).
var Packages = []string{
	"jupyter-server==2.21.1",
	"ipykernel==7.4.0",
	"numpy==2.4.6",
	"pandas==3.1.1",
	"matplotlib==3.11.2",
	"bash_kernel==0.10.0",
}

// InstallCmd makes the venv: Jupyter Server, the Python kernel with
// numpy, pandas and matplotlib, and the Bash kernel (DenoInstallCmd adds
// JavaScript and TypeScript). It runs as root in a build sandbox that
// reaches PyPI.
func InstallCmd() string {
	venv := Dir + "/venv"
	return strings.Join([]string{
		"set -e",
		// The system's CA bundle rather than pip's own: a mirror or an
		// egress proxy the host trusts works from the build too.
		"if [ -f /etc/ssl/certs/ca-certificates.crt ]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi",
		"python3 -m venv " + venv,
		venv + "/bin/pip install --no-cache-dir --disable-pip-version-check --progress-bar off --timeout 120 --retries 10 " + strings.Join(Packages, " "),
		venv + "/bin/python -m bash_kernel.install --sys-prefix",
		// Matplotlib's font cache, built once here rather than by the
		// first plot of every sandbox.
		venv + "/bin/python -c 'import matplotlib.font_manager'",
	}, "\n")
}

// DenoVersion is the Deno that runs the template's JavaScript and
// TypeScript: its Jupyter kernel answers like E2B's (the last expression
// is the result, a throw is an error with name and value) and runs
// TypeScript without a type check. npm's deno package carries the binary
// for the build's platform in an exactly pinned dependency, so the pin
// makes the same layer.
const DenoVersion = "2.9.6"

// denoKernel is the kernelspec of the deno kernel. NO_COLOR: results are
// plain text rather than ANSI-coloured.
const denoKernel = `{"argv": ["` + Dir + `/deno/node_modules/deno/deno", "jupyter", "--kernel", "--conn", "{connection_file}"], ` +
	`"display_name": "Deno", "language": "typescript", "env": {"NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}}`

// DenoInstallCmd installs Deno from npm beside the venv and registers its
// kernel in the venv, where the template's Jupyter finds it. A step of its
// own after InstallCmd's, so that adding it left the venv's layer cached.
func DenoInstallCmd() string {
	deno := Dir + "/deno"
	kernelDir := Dir + "/venv/share/jupyter/kernels/deno"
	return strings.Join([]string{
		"set -e",
		// A base without npm (the Incus test image) gets no JavaScript
		// and TypeScript: those languages then answer 400, as R does.
		"if ! command -v npm >/dev/null; then echo 'sandboxd: no npm in the base: the JavaScript and TypeScript kernels are left out'; exit 0; fi",
		// As for pip: the system's CA bundle.
		"if [ -f /etc/ssl/certs/ca-certificates.crt ]; then export NPM_CONFIG_CAFILE=/etc/ssl/certs/ca-certificates.crt; fi",
		"mkdir -p " + deno,
		"npm install --prefix " + deno + " --cache /tmp/sandboxd-npm-cache --no-audit --no-fund --no-update-notifier --loglevel=error --fetch-retries=5 deno@" + DenoVersion,
		"rm -rf /tmp/sandboxd-npm-cache",
		// The package's postinstall links the platform's binary into
		// place; an npm that skips install scripts leaves that undone.
		"[ -x " + deno + "/node_modules/deno/deno ] || (cd " + deno + "/node_modules/deno && node install.cjs)",
		deno + "/node_modules/deno/deno --version",
		"mkdir -p " + kernelDir,
		"printf '%s\\n' '" + denoKernel + "' > " + kernelDir + "/kernel.json",
	}, "\n")
}

// StartCmd and ReadyCmd are the template's: Jupyter and the server start
// before a sandbox is handed out (a warm pool's members start them before
// any claim), which is ready once the default Python kernel runs.
const (
	StartCmd = Dir + "/start.sh"
	ReadyCmd = Dir + "/code-interpreter --check"
)

//go:embed assets
var assets embed.FS

// Archive is the files a COPY step puts into Dir: the start script, the
// IPython profile (E2B's chart and data formats) and server, the static
// code-interpreter binary. Entries carry no times, so that the same inputs
// make the same archive and hash.
func Archive(server []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	add := func(name string, mode int64, data []byte) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), Format: tar.FormatPAX})
	}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := "code-interpreter/" + strings.TrimPrefix(strings.TrimPrefix(p, "assets"), "/")
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: strings.TrimSuffix(name, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX})
		}
		data, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		mode := int64(0o644)
		if path.Ext(p) == ".sh" {
			mode = 0o755
		}
		if err := add(name, mode, data); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err == nil {
		if err = add("code-interpreter/code-interpreter", 0o755, server); err == nil {
			_, err = tw.Write(server)
		}
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("code interpreter archive: %w", err)
	}
	return buf.Bytes(), nil
}
