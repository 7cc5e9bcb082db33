package agentbin

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string // regular files in the directory
		dirs  []string // directories in it
		want  string
	}{
		{"both: envd-rs", []string{"envd", "envd-rs"}, nil, "envd-rs"},
		{"envd alone (no cargo)", []string{"envd"}, nil, "envd"},
		{"neither: envd, which the backend reports missing", nil, nil, "envd"},
		{"envd-rs a directory: not an agent", []string{"envd"}, []string{"envd-rs"}, "envd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range tc.dirs {
				if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := Path(dir), filepath.Join(dir, tc.want); got != want {
				t.Errorf("Path = %s; want %s", got, want)
			}
		})
	}
}
