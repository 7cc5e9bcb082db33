package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// adminStore opens the store (openStore) for one admin command, under a
// 30-second deadline; done closes it.
func adminStore(dataDir, storeURL string) (ctx context.Context, st *store.Store, done func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err = openStore(ctx, dataDir, storeURL)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, st, func() {
		st.Close()
		cancel()
	}, nil
}

// keys manages API keys. They work while a server runs on the same data
// dir: the store is shared through SQLite's WAL.
func keys(args []string) error {
	if len(args) == 0 {
		return errors.New("keys: want create, list or revoke")
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "state directory")
	storeURL := fs.String("store", "", storeUsage)
	tenantName := fs.String("tenant", "", "tenant name")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	ctx, st, done, err := adminStore(*dataDir, *storeURL)
	if err != nil {
		return err
	}
	defer done()
	switch args[0] {
	case "create":
		if *tenantName == "" {
			return errors.New("keys create: --tenant is required")
		}
		if _, err := st.EnsureTenant(ctx, *tenantName); err != nil {
			return err
		}
		key, info, err := st.CreateKey(ctx, tenant.ID(*tenantName))
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "created key %s (%s...) for tenant %s\n", info.ID, info.Prefix, info.Tenant)
		fmt.Println(key)
	case "list":
		var ts []tenant.ID
		if *tenantName != "" {
			ts = []tenant.ID{tenant.ID(*tenantName)}
		} else {
			all, err := st.ListTenants(ctx)
			if err != nil {
				return err
			}
			for _, t := range all {
				ts = append(ts, t.ID)
			}
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTENANT\tPREFIX\tCREATED\tREVOKED")
		for _, t := range ts {
			ks, err := st.ListKeys(ctx, t)
			if err != nil {
				return err
			}
			for _, k := range ks {
				revoked := "-"
				if k.Revoked() {
					revoked = k.RevokedAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s...\t%s\t%s\n", k.ID, k.Tenant, k.Prefix, k.CreatedAt.Format(time.RFC3339), revoked)
			}
		}
		return tw.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return errors.New("keys revoke: want one key ID")
		}
		info, err := st.RevokeKey(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "revoked key %s of tenant %s\n", info.ID, info.Tenant)
	default:
		return fmt.Errorf("keys: unknown subcommand %q", args[0])
	}
	return nil
}

func tenants(args []string) error {
	if len(args) == 0 {
		return errors.New("tenants: want list, create or set")
	}
	fs := flag.NewFlagSet("tenants "+args[0], flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "state directory")
	storeURL := fs.String("store", "", storeUsage)
	var settings settingFlags
	if args[0] == "set" {
		settings.register(fs)
	}
	// NAME may come before the flags (`tenants set acme --min-warm 2`),
	// which the flag package alone would not parse.
	rest, name := args[1:], ""
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if name == "" && fs.NArg() > 0 {
		// NAME between flags: parse the flags after it too.
		name = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("tenants %s: unexpected %q", args[0], fs.Arg(0))
	}
	ctx, st, done, err := adminStore(*dataDir, *storeURL)
	if err != nil {
		return err
	}
	defer done()
	switch args[0] {
	case "create":
		if name == "" {
			return errors.New("tenants create: want one NAME")
		}
		t, err := st.CreateTenant(ctx, name)
		if err != nil {
			return err
		}
		fmt.Println(t.ID)
	case "set":
		if name == "" {
			return errors.New("tenants set: want NAME")
		}
		return tenantsSet(ctx, st, name, &settings, os.Stdout)
	case "list":
		all, err := st.ListTenants(ctx)
		if err != nil {
			return err
		}
		return printTenants(os.Stdout, all)
	default:
		return fmt.Errorf("tenants: unknown subcommand %q", args[0])
	}
	return nil
}
