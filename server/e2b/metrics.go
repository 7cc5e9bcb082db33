package e2b

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/sandbox"
)

func metric(s sandbox.Sample) e2bapi.SandboxMetric {
	return e2bapi.SandboxMetric{
		Timestamp:     s.At,
		TimestampUnix: s.At.Unix(),
		CpuCount:      int32(s.CPUCount),
		CpuUsedPct:    float32(s.CPUUsedPct),
		MemUsed:       int64(s.MemUsed),
		MemTotal:      int64(s.MemTotal),
		DiskUsed:      int64(s.DiskUsed),
		DiskTotal:     int64(s.DiskTotal),
	}
}

// unixSeconds is an optional bound in unix seconds; nil is open (zero).
func unixSeconds(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.Unix(*v, 0)
}

// GetSandboxMetrics answers the samples taken in [start, end] (unix
// seconds, both optional), oldest first: the history RunMetrics keeps.
func (a *API) GetSandboxMetrics(ctx context.Context, req e2bapi.GetSandboxMetricsRequestObject) (e2bapi.GetSandboxMetricsResponseObject, error) {
	start, end := unixSeconds(req.Params.Start), unixSeconds(req.Params.End)
	if req.Params.End != nil {
		// A sample at 12:00:00.7 is in a window that ends at 12:00:00.
		end = end.Add(time.Second - time.Nanosecond)
	}
	samples, err := a.mgr.Metrics(ctx, req.SandboxID, start, end)
	if err != nil {
		return nil, err
	}
	out := make(e2bapi.GetSandboxMetrics200JSONResponse, 0, len(samples))
	for _, s := range samples {
		out = append(out, metric(s))
	}
	return out, nil
}

// ListSandboxesMetrics answers the latest sample of each sandbox asked for
// that the caller can see; as in E2B, the others are left out.
func (a *API) ListSandboxesMetrics(ctx context.Context, req e2bapi.ListSandboxesMetricsRequestObject) (e2bapi.ListSandboxesMetricsResponseObject, error) {
	if len(req.Params.SandboxIds) > 100 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "sandbox_ids: at most 100")
	}
	out := e2bapi.ListSandboxesMetrics200JSONResponse{Sandboxes: map[string]e2bapi.SandboxMetric{}}
	for _, id := range req.Params.SandboxIds {
		s, ok, err := a.mgr.LatestMetrics(ctx, id)
		if err != nil || !ok {
			continue
		}
		out.Sandboxes[id] = metric(s)
	}
	return out, nil
}
