package envd

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// serveLogs answers GET /logs (envdapi.LogsPath) from the ring. It is
// behind withAuth like every route but /health, /init and /files, and it
// logs nothing itself: each read would otherwise add a record to read.
func (s *Server) serveLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			rpcerr.WriteJSON(w, http.StatusBadRequest, "after: want a sequence number")
			return
		}
		after = n
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, s.logs.After(q.Get("boot"), after))
}

// Log is the logger of s, whose records at info and above GET /logs
// serves: what envd logs outside the server belongs there too.
func (s *Server) Log() *slog.Logger { return s.log }
