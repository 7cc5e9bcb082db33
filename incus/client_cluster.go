package incus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// ClusterMember is one entry of GET /1.0/cluster/members?recursion=1.
type ClusterMember struct {
	Name string `json:"server_name"`
	// URL is the member's API address, https://host:port.
	URL string `json:"url"`
	// Status is Online, Offline, Evacuated or Blocked.
	Status  string `json:"status"`
	Message string `json:"message"`
	// Roles has "database-leader" on the member that leads the cluster's
	// database.
	Roles []string `json:"roles"`
}

// ClusterMembers lists the members of the cluster the client talks to; a
// server that is not clustered answers with an error (ErrInvalidSpec or
// ErrNotFound, by version).
func (c *Client) ClusterMembers(ctx context.Context) ([]ClusterMember, error) {
	var out []ClusterMember
	err := c.query(ctx, http.MethodGet, "/1.0/cluster/members", url.Values{"recursion": {"1"}}, nil, &out)
	return out, err
}

// Resources is the part of GET /1.0/resources the backend reads.
type Resources struct {
	Memory struct {
		Total uint64 `json:"total"`
		Used  uint64 `json:"used"`
	} `json:"memory"`
	CPU struct {
		Total uint64 `json:"total"`
	} `json:"cpu"`
}

// Resources returns the hardware of cluster member target (empty: the
// server answering).
func (c *Client) Resources(ctx context.Context, target string) (*Resources, error) {
	var r Resources
	if err := c.getOn(ctx, "/1.0/resources", target, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// getOn reads path of cluster member target (empty: the server
// answering) into out.
func (c *Client) getOn(ctx context.Context, path, target string, out any) error {
	var q url.Values
	if target != "" {
		q = url.Values{"target": {target}}
	}
	return c.query(ctx, http.MethodGet, path, q, nil, out)
}

// PoolResources is the part of GET /1.0/storage-pools/<pool>/resources
// the backend reads: the space of the pool's source on one member.
type PoolResources struct {
	Space struct {
		Used  uint64 `json:"used"`
		Total uint64 `json:"total"`
	} `json:"space"`
}

// StoragePoolResources returns the space of pool on cluster member target
// (empty: the server answering).
func (c *Client) StoragePoolResources(ctx context.Context, pool, target string) (*PoolResources, error) {
	var r PoolResources
	if err := c.getOn(ctx, "/1.0/storage-pools/"+url.PathEscape(pool)+"/resources", target, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Exec runs command in instance name, without input or recorded output,
// and waits for it; a non-zero exit is an error.
func (c *Client) Exec(ctx context.Context, name string, command []string) error {
	body := map[string]any{
		"command": command, "wait-for-websocket": false, "interactive": false, "record-output": false,
	}
	op, err := c.async(ctx, http.MethodPost, "/1.0/instances/"+url.PathEscape(name)+"/exec", body)
	if err != nil {
		return err
	}
	o, err := c.Wait(ctx, op)
	if err != nil {
		return err
	}
	var md struct {
		Return *int `json:"return"`
	}
	if len(o.Metadata) > 0 {
		_ = json.Unmarshal(o.Metadata, &md)
	}
	if md.Return != nil && *md.Return != 0 {
		return fmt.Errorf("incus exec %v in %s: exit status %d", command, name, *md.Return)
	}
	return nil
}
