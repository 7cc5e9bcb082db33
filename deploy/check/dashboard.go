package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"
)

type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// grafanaVars are what Grafana puts for the dashboard's variables before a
// query goes to Prometheus.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$job", ".*", "$instance", ".*")

var metricName = regexp.MustCompile(`\bsandboxd_[a-z0-9_]+`)

func checkDashboard(r *results, file, metricsURL, promURL string) {
	var d dashboard
	data, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(data, &d)
	}
	r.check("dashboard "+file+" parses", err)
	if err != nil {
		return
	}
	r.check("dashboard shape", dashboardShape(d))

	exposition, err := get(metricsURL)
	r.check("sandboxd /metrics answers", err)
	if err != nil {
		return
	}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			expr := grafanaVars.Replace(t.Expr)
			name := fmt.Sprintf("panel %d %q %s: %s", p.ID, p.Title, t.RefID, t.Expr)
			r.check(name, checkQuery(promURL, expr, exposition))
		}
	}
}

func dashboardShape(d dashboard) error {
	if d.UID == "" || d.Title == "" {
		return errors.New("no uid or title")
	}
	ids := map[int]bool{}
	targets := 0
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID <= 0 {
			return fmt.Errorf("panel %q: id %d not unique and positive", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			return fmt.Errorf("panel %q: gridPos %+v outside Grafana's 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			return fmt.Errorf("panel %q: datasource %+v; want the dashboard's Prometheus variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			return fmt.Errorf("panel %q: no query", p.Title)
		}
		for _, t := range p.Targets {
			if t.Expr == "" || t.RefID == "" {
				return fmt.Errorf("panel %q: a target without expr or refId", p.Title)
			}
			targets++
		}
	}
	if targets == 0 {
		return errors.New("no queries")
	}
	return nil
}

// checkQuery evaluates expr on Prometheus, and checks that every sandboxd
// metric it names is in the exposition and has series in Prometheus.
func checkQuery(promURL, expr, exposition string) error {
	if _, err := promQuery(promURL, expr); err != nil {
		return err
	}
	names := metricName.FindAllString(expr, -1)
	if len(names) == 0 {
		return errors.New("names no sandboxd metric")
	}
	for _, n := range names {
		if !strings.Contains("\n"+exposition, "\n"+n+" ") && !strings.Contains("\n"+exposition, "\n"+n+"{") {
			return fmt.Errorf("%s is not in sandboxd's /metrics", n)
		}
		res, err := promQuery(promURL, "count("+n+")")
		if err != nil {
			return err
		}
		if len(res) == 0 {
			return fmt.Errorf("Prometheus has no series of %s", n)
		}
	}
	return nil
}

// promQuery runs an instant query and returns its vector.
func promQuery(promURL, expr string) ([]json.RawMessage, error) {
	body, err := get(promURL + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	var resp struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, resp.Error)
	}
	return resp.Data.Result, nil
}

var client = &http.Client{Timeout: 10 * time.Second}

func get(u string) (string, error) {
	resp, err := client.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode >= 300 {
		// Prometheus answers a bad query 400 with its JSON error.
		if strings.Contains(string(b), `"status":"error"`) {
			return string(b), nil
		}
		return "", fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return string(b), nil
}
