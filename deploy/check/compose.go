package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

func checkCompose(r *results, file string) {
	for _, tc := range []struct {
		profiles []string
		want     []string
	}{
		{nil, []string{"grafana", "prometheus", "sandboxd"}},
		{[]string{"incus"}, []string{"grafana", "prometheus", "sandboxd", "sandboxd-incus"}},
	} {
		name := fmt.Sprintf("compose %s, profiles %v", file, tc.profiles)
		p, err := loadCompose(file, tc.profiles)
		if err == nil {
			err = composeShape(p, tc.want)
		}
		r.check(name, err)
	}
}

func loadCompose(file string, profiles []string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{file}, cli.WithName("sandboxd"), cli.WithProfiles(profiles))
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

// composeShape checks what the loader cannot know: the services a profile
// gives, that sandboxd runs privileged with its data in a named volume, and
// that the repository's files the services mount are there.
func composeShape(p *types.Project, want []string) error {
	got := p.ServiceNames()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return fmt.Errorf("services %v; want %v", got, want)
	}
	for _, s := range p.Services {
		if strings.HasPrefix(s.Name, "sandboxd") {
			if !s.Privileged {
				return fmt.Errorf("%s: not privileged (the local backend makes namespaces, mounts and cgroups)", s.Name)
			}
			if !slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
				return v.Type == types.VolumeTypeVolume && v.Target == "/var/lib/sandboxd"
			}) {
				return fmt.Errorf("%s: /var/lib/sandboxd is not a named volume", s.Name)
			}
		}
		if s.Name != "sandboxd" && s.Name != "sandboxd-incus" && s.HealthCheck == nil {
			return fmt.Errorf("%s: no healthcheck (sandboxd's is its image's)", s.Name)
		}
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind || !strings.HasPrefix(v.Source, p.WorkingDir) {
				continue // a named volume, or a host path such as Incus' socket
			}
			if _, err := os.Stat(v.Source); err != nil {
				return fmt.Errorf("%s mounts %s: %w", s.Name, filepath.Base(v.Source), err)
			}
		}
	}
	if s, ok := p.Services["sandboxd"]; !ok || s.Build == nil {
		return fmt.Errorf("sandboxd is not built from the repository")
	} else if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
		return fmt.Errorf("sandboxd's Dockerfile: %w", err)
	}
	return nil
}
