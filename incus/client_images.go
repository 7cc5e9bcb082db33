package incus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// The image calls of the client: what the backend's layers (layers.go)
// need to publish, upload, name and delete images.

// ImageSource is where POST /1.0/images takes a new image from.
type ImageSource struct {
	Type string `json:"type"` // "snapshot" or "instance"
	Name string `json:"name"` // "<instance>/<snapshot>" for a snapshot
}

// ImagesPost creates an image from an instance or one of its snapshots.
type ImagesPost struct {
	Source ImageSource `json:"source"`
	// CompressionAlgorithm is the image tarball's compression: "none"
	// saves the seconds gzip takes (the image lives on this host only).
	CompressionAlgorithm string            `json:"compression_algorithm,omitempty"`
	Properties           map[string]string `json:"properties,omitempty"`
}

// imageCreated is the metadata of a finished image creation.
type imageCreated struct {
	Fingerprint string `json:"fingerprint"`
}

func createdFingerprint(op *Operation) (string, error) {
	var m imageCreated
	if err := json.Unmarshal(op.Metadata, &m); err != nil || m.Fingerprint == "" {
		return "", fmt.Errorf("incus: %s: no fingerprint in the operation's metadata %s", op.Description, op.Metadata)
	}
	return m.Fingerprint, nil
}

// CreateImage publishes an image (from a snapshot or a stopped instance)
// and returns its fingerprint once it exists.
func (c *Client) CreateImage(ctx context.Context, req ImagesPost) (string, error) {
	op, err := c.run(ctx, http.MethodPost, "/1.0/images", req)
	if err != nil {
		return "", err
	}
	return createdFingerprint(op)
}

// UploadImage creates an image from a unified image tarball (metadata.yaml
// and rootfs/, uncompressed or compressed) read from r, and returns its
// fingerprint once it exists.
func (c *Client) UploadImage(ctx context.Context, r io.Reader) (string, error) {
	resp, err := c.send(ctx, http.MethodPost, "/1.0/images", nil, r,
		http.Header{"Content-Type": {"application/octet-stream"}})
	if err != nil {
		return "", err
	}
	if resp.Type != "async" || resp.Operation == "" {
		return "", newError(http.MethodPost, "/1.0/images", resp.StatusCode, "expected an async answer, got "+resp.Type)
	}
	op, err := c.Wait(ctx, trimOperation(resp.Operation))
	if err != nil {
		return "", err
	}
	return createdFingerprint(op)
}

// DeleteImage deletes an image (and its aliases) and waits for it.
func (c *Client) DeleteImage(ctx context.Context, fingerprint string) error {
	_, err := c.run(ctx, http.MethodDelete, "/1.0/images/"+url.PathEscape(fingerprint), nil)
	return err
}

// CreateImageAlias names image fingerprint alias; an alias that exists
// fails with an error that errors.Is runtime.ErrAlreadyExists.
func (c *Client) CreateImageAlias(ctx context.Context, alias, fingerprint, description string) error {
	body := map[string]string{"name": alias, "target": fingerprint, "description": description}
	return c.query(ctx, http.MethodPost, "/1.0/images/aliases", nil, body, nil)
}

// CreateSnapshot snapshots instance name's volume (not its memory) as snap.
func (c *Client) CreateSnapshot(ctx context.Context, name, snap string) error {
	body := map[string]any{"name": snap, "stateful": false}
	_, err := c.run(ctx, http.MethodPost, "/1.0/instances/"+url.PathEscape(name)+"/snapshots", body)
	return err
}

// DeleteSnapshot deletes snapshot snap of instance name.
func (c *Client) DeleteSnapshot(ctx context.Context, name, snap string) error {
	_, err := c.run(ctx, http.MethodDelete,
		"/1.0/instances/"+url.PathEscape(name)+"/snapshots/"+url.PathEscape(snap), nil)
	return err
}

// Snapshots lists the names of instance name's snapshots.
func (c *Client) Snapshots(ctx context.Context, name string) ([]string, error) {
	var urls []string
	if err := c.query(ctx, http.MethodGet, "/1.0/instances/"+url.PathEscape(name)+"/snapshots", nil, nil, &urls); err != nil {
		return nil, err
	}
	for i, u := range urls {
		urls[i] = u[strings.LastIndex(u, "/")+1:]
	}
	return urls, nil
}

// ImageAliases lists every image alias: name → fingerprint.
func (c *Client) ImageAliases(ctx context.Context) (map[string]string, error) {
	var all []struct {
		Name   string `json:"name"`
		Target string `json:"target"`
	}
	if err := c.query(ctx, http.MethodGet, "/1.0/images/aliases", url.Values{"recursion": {"1"}}, nil, &all); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(all))
	for _, a := range all {
		out[a.Name] = a.Target
	}
	return out, nil
}

// Images lists every image with its properties and aliases.
func (c *Client) Images(ctx context.Context) ([]*Image, error) {
	var all []*Image
	if err := c.query(ctx, http.MethodGet, "/1.0/images", url.Values{"recursion": {"1"}}, nil, &all); err != nil {
		return nil, err
	}
	return all, nil
}
