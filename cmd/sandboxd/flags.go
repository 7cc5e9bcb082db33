package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
)

// parseFlags applies, lowest precedence first: defaults, the --config file
// (a JSON object of flag names to values), SANDBOXD_* env vars, the command
// line.
func parseFlags(fs *flag.FlagSet, args []string) error {
	config := fs.String("config", "", "JSON file of flag values (env SANDBOXD_CONFIG)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fromEnv := func(name string) (string, bool) {
		return os.LookupEnv("SANDBOXD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
	if !set["config"] {
		if v, ok := fromEnv("config"); ok {
			*config = v
		}
	}
	var file map[string]any
	if *config != "" {
		raw, err := os.ReadFile(*config)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if err := json.Unmarshal(raw, &file); err != nil {
			return fmt.Errorf("config %s: %w", *config, err)
		}
		for k := range file {
			if fs.Lookup(k) == nil {
				return fmt.Errorf("config %s: unknown setting %q", *config, k)
			}
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] || f.Name == "config" {
			return
		}
		if v, ok := fromEnv(f.Name); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("env SANDBOXD_%s: %w", strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")), e)
			}
			return
		}
		if v, ok := file[f.Name]; ok {
			if e := f.Value.Set(fmt.Sprint(v)); e != nil {
				err = fmt.Errorf("config %s: %w", f.Name, e)
			}
		}
	})
	return err
}

// listFlag collects a repeated flag's values, each of which may also be a
// comma-separated list (the form SANDBOXD_<FLAG> and a --config file give).
type listFlag []string

func (f *listFlag) String() string { return strings.Join(*f, ",") }

func (f *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*f = append(*f, s)
		}
	}
	return nil
}
