package envd

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

const maxInitBody = 1 << 20

// init applies /init (envdapi.InitRequest). The first call may set the access token freely; once a
// token is set, a caller must prove it knows it (header or body), so a process
// inside the sandbox cannot take envd over by re-initialising it.
func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	var req envdapi.InitRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, maxInitBody+1))
	if err != nil {
		rpcerr.WriteJSON(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	if len(body) > maxInitBody {
		rpcerr.WriteJSON(w, http.StatusRequestEntityTooLarge, "init body too large")
		return
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			rpcerr.WriteJSON(w, http.StatusBadRequest, "invalid init body: "+err.Error())
			return
		}
	}
	if s.token.IsSet() {
		header := r.Header.Get(envdapi.AccessTokenHeader)
		bodyToken := ""
		if req.AccessToken != nil {
			bodyToken = *req.AccessToken
		}
		if !s.token.Equal(header) && !s.token.Equal(bodyToken) {
			rpcerr.WriteJSON(w, http.StatusUnauthorized, "access token reset not authorized")
			return
		}
	}
	// The default user was resolved when envd started, and the /init of every
	// create names it again: only a new name needs the passwd lookup.
	if req.DefaultUser != "" && req.DefaultUser != s.defaults.User() {
		if _, err := permissions.Lookup(req.DefaultUser); err != nil {
			rpcerr.WriteJSON(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	s.defaults.MergeEnvs(req.EnvVars)
	s.defaults.SetUser(req.DefaultUser)
	s.defaults.SetWorkdir(req.DefaultWorkdir)
	if req.AccessToken != nil {
		s.token.Set(*req.AccessToken)
	}
	// The env vars' names only: their values may be secrets, as the token is.
	s.log.Info("initialised", "env_vars", strings.Join(slices.Sorted(maps.Keys(req.EnvVars)), ","),
		"default_user", s.defaults.User(), "workdir", s.defaults.Workdir(),
		"access_token_set", req.AccessToken != nil && *req.AccessToken != "")
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
