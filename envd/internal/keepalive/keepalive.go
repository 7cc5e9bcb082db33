// Package keepalive reads the client's requested keepalive interval for
// envd's server streams.
package keepalive

import (
	"net/http"
	"strconv"
	"time"
)

// Header is what E2B's SDKs send on Start, Connect and WatchDir (value in seconds).
const Header = "Keepalive-Ping-Interval"

// Default applies when the header is absent or not a positive integer.
const Default = 90 * time.Second

// Interval returns the keepalive period a stream should use.
func Interval(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get(Header))
	if err != nil || n <= 0 {
		return Default
	}
	return time.Duration(n) * time.Second
}
