package local

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestUnpackThroughSymlink: a raw stream (not flattened by mutate.Extract,
// which already drops entries under a symlink) that writes through a
// symlink it planted is refused, and nothing lands outside.
func TestUnpackThroughSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unpacking keeps ownership: needs root")
	}
	for _, tc := range []struct{ name, link, entry string }{
		{"file", "OUT", "link/escape"},
		{"dir", "OUT", "link/sub/escape"},
		{"relative", "../outside", "link/escape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			dest := filepath.Join(base, "dest")
			for _, d := range []string{outside, dest} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			target := tc.link
			if target == "OUT" {
				target = outside
			}
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			_ = tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
			_ = tw.WriteHeader(&tar.Header{Name: tc.entry, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
			_, _ = tw.Write([]byte("x"))
			_ = tw.Close()
			u, err := newUnpacker(dest)
			if err != nil {
				t.Fatal(err)
			}
			defer u.close()
			err = u.unpack(t.Context(), tar.NewReader(&buf))
			if err == nil {
				t.Errorf("unpack succeeded; want it refused")
			}
			t.Log(err)
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("outside has %d entries; want none", len(ents))
			}
		})
	}
}
