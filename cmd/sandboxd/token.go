package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/store"
)

// jwtSecretFile is the HS256 secret of the native API, in the data dir. The
// server creates it on first start; `token create` reads (or creates) it.
const jwtSecretFile = "jwt.secret"

// jwksFile, in the data dir or named by SANDBOXD_JWKS_FILE, holds an
// identity provider's public keys (RS256, EdDSA).
const jwksFile = "jwks.json"

// nativeJWT returns the verifier of the native API's tokens for a data dir.
func nativeJWT(dataDir string) (*jwtauth.Verifier, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	secret, err := jwtauth.LoadOrCreateSecret(filepath.Join(dataDir, jwtSecretFile))
	if err != nil {
		return nil, err
	}
	path, explicit := os.LookupEnv("SANDBOXD_JWKS_FILE")
	if !explicit {
		path = filepath.Join(dataDir, jwksFile)
	}
	jwks, err := jwtauth.LoadJWKS(path)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && !explicit:
		jwks = nil
	default:
		return nil, fmt.Errorf("JWKS %s: %w", path, err)
	}
	return jwtauth.NewVerifier(secret, jwks), nil
}

// token issues native-API JWTs signed with the data dir's secret.
//
//	sandboxd token create --tenant NAME [--scope "sandboxes:read sandboxes:write"] [--ttl 1h]
func token(args []string) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("token: want create")
	}
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "state directory (holds jwt.secret)")
	tenantName := fs.String("tenant", "", "tenant the token acts as (its sub claim)")
	scope := fs.String("scope", jwtauth.ScopeRead+" "+jwtauth.ScopeWrite, "space-separated scopes")
	ttl := fs.Duration("ttl", time.Hour, "lifetime")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *tenantName == "" {
		return errors.New("token create: --tenant is required")
	}
	// The server creates the tenant of a token on its first use, with the
	// rules of `keys create`: a name it would reject makes a token that can
	// only ever answer 401, so refuse it here.
	if !store.ValidTenantName(*tenantName) {
		return fmt.Errorf("token create: invalid tenant name %q: want 1 to 63 lowercase letters, digits and dashes, not starting with a dash", *tenantName)
	}
	scopes := strings.Fields(*scope)
	for _, s := range scopes {
		if s != jwtauth.ScopeRead && s != jwtauth.ScopeWrite {
			return fmt.Errorf("token create: unknown scope %q (want %s, %s)", s, jwtauth.ScopeRead, jwtauth.ScopeWrite)
		}
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return err
	}
	secret, err := jwtauth.LoadOrCreateSecret(filepath.Join(*dataDir, jwtSecretFile))
	if err != nil {
		return err
	}
	tok, err := jwtauth.Issue(secret, *tenantName, scopes, *ttl)
	if err != nil {
		return fmt.Errorf("token create: %w", err)
	}
	fmt.Println(tok)
	return nil
}
