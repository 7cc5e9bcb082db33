package codeinterp

import (
	"encoding/json"
	"strings"
	"testing"
)

// The kernelspec goes into the install command in single quotes: it must
// be JSON that Jupyter reads, without a quote of its own, and start the
// binary the command installs.
func TestDenoKernelSpec(t *testing.T) {
	var spec struct {
		Argv     []string          `json:"argv"`
		Language string            `json:"language"`
		Env      map[string]string `json:"env"`
	}
	if err := json.Unmarshal([]byte(denoKernel), &spec); err != nil {
		t.Fatalf("kernel.json: %v", err)
	}
	if strings.Contains(denoKernel, "'") {
		t.Error("the kernelspec has a ' and breaks its shell quoting")
	}
	cmd := DenoInstallCmd()
	if len(spec.Argv) == 0 || !strings.Contains(cmd, "\n"+spec.Argv[0]+" --version") {
		t.Errorf("the kernel starts %v, which the install does not check", spec.Argv)
	}
	if !strings.Contains(cmd, "deno@"+DenoVersion+"\n") || !strings.Contains(cmd, "'"+denoKernel+"' > "+Dir+"/venv/share/jupyter/kernels/"+kernels["javascript"]+"/kernel.json") {
		t.Errorf("install command:\n%s", cmd)
	}
	if spec.Env["NO_COLOR"] == "" {
		t.Error("results would carry ANSI colours")
	}
}
