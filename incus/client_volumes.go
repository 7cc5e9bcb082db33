package incus

import (
	"context"
	"net/http"
	"net/url"
)

// StorageVolumesPost creates a custom storage volume.
type StorageVolumesPost struct {
	Name        string            `json:"name"`
	Type        string            `json:"type"`         // "custom"
	ContentType string            `json:"content_type"` // "filesystem"
	Config      map[string]string `json:"config,omitempty"`
	Description string            `json:"description,omitempty"`
}

// StorageVolume is a storage volume as Incus reports it.
type StorageVolume struct {
	Name   string            `json:"name"`
	Type   string            `json:"type"`
	Config map[string]string `json:"config"`
	// UsedBy lists the instances (as API paths) that attach it.
	UsedBy []string `json:"used_by"`
	// Location is the cluster member that holds it (local pools), "none"
	// off a cluster.
	Location string `json:"location"`
}

func customVolumesPath(pool string) string {
	return "/1.0/storage-pools/" + url.PathEscape(pool) + "/volumes/custom"
}

// CreateStorageVolume creates a custom volume on pool, and waits for it
// when Incus answers with an operation.
func (c *Client) CreateStorageVolume(ctx context.Context, pool string, req StorageVolumesPost) error {
	req.Type = "custom"
	return c.maybeWait(ctx, http.MethodPost, "/1.0/storage-pools/"+url.PathEscape(pool)+"/volumes", req)
}

// StorageVolume returns custom volume name of pool.
func (c *Client) StorageVolume(ctx context.Context, pool, name string) (*StorageVolume, error) {
	var v StorageVolume
	if err := c.query(ctx, http.MethodGet, customVolumesPath(pool)+"/"+url.PathEscape(name), nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// StorageVolumes returns the custom volumes of pool.
func (c *Client) StorageVolumes(ctx context.Context, pool string) ([]*StorageVolume, error) {
	var vs []*StorageVolume
	if err := c.query(ctx, http.MethodGet, customVolumesPath(pool), url.Values{"recursion": {"1"}}, nil, &vs); err != nil {
		return nil, err
	}
	return vs, nil
}

// DeleteStorageVolume deletes custom volume name of pool.
func (c *Client) DeleteStorageVolume(ctx context.Context, pool, name string) error {
	return c.maybeWait(ctx, http.MethodDelete, customVolumesPath(pool)+"/"+url.PathEscape(name), nil)
}

// maybeWait does a call that Incus answers synchronously or with an
// operation (storage calls differ by driver and version), waiting for the
// latter.
func (c *Client) maybeWait(ctx context.Context, method, path string, body any) error {
	r, err := c.do(ctx, method, path, nil, body)
	if err != nil {
		return err
	}
	if r.Type == "async" && r.Operation != "" {
		_, err = c.Wait(ctx, trimOperation(r.Operation))
	}
	return err
}
