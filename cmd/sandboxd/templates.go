package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/tenant"
)

// snapshotLimits bound each tenant's snapshots (--max-snapshots,
// --max-snapshot-mb) and each publish (--max-publish-paths,
// --max-publish-mb).
type snapshotLimits struct{ count, mb, publishPaths, publishMB int }

// newTemplates makes the template registry and builder on backend be.
// Builds need a backend that holds layers (runtime.Layered); on another,
// everything but a build works and a build fails saying why.
func newTemplates(st *store.Store, be runtime.Backend, dataDir string, maxBuilds int, collectEvery time.Duration, limits func(tenant.ID) tenant.BuildBudget,
	snapshots snapshotLimits, plainHTTP string, defaults func() runtime.Resources, log *slog.Logger) (*template.Service, error) {
	layered, _ := be.(runtime.Layered)
	lister, _ := be.(runtime.TemplateLister)
	var svc *template.Service
	builtin := func(name string) bool {
		if lister == nil || (svc != nil && svc.IsBuild(name)) {
			return false
		}
		names, err := lister.Templates(context.Background())
		return err == nil && slices.Contains(names, name)
	}
	var plain []string
	for _, h := range strings.Split(plainHTTP, ",") {
		if h = strings.TrimSpace(h); h != "" {
			plain = append(plain, h)
		}
	}
	svc, err := template.New(template.Config{
		Store: st, Backend: be, Layered: layered, Builtin: builtin,
		Dir: filepath.Join(dataDir, "templates"), MaxBuilds: maxBuilds, Limits: limits,
		MaxSnapshots: snapshots.count, MaxSnapshotMB: snapshots.mb,
		MaxPublishPaths: snapshots.publishPaths, MaxPublishMB: snapshots.publishMB,
		Defaults: defaults, PlainHTTPRegistries: plain, CollectEvery: collectEvery,
		Log: log.With("component", "template"),
	})
	return svc, err
}
