// Package grafana holds the compose demo's Grafana dashboard, embedded so
// that tests can check it against the metrics the services export.
package grafana

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
)

//go:embed dashboards/onceflow.json
var dashboard []byte

// QueriedMetrics returns the metric names in the dashboard's queries that
// pattern matches, each once, in the order they first appear.
func QueriedMetrics(pattern *regexp.Regexp) ([]string, error) {
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dashboard, &dash); err != nil {
		return nil, fmt.Errorf("read the dashboard: %w", err)
	}
	seen := map[string]bool{}
	var names []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range pattern.FindAllString(tg.Expr, -1) {
				if !seen[m] {
					seen[m] = true
					names = append(names, m)
				}
			}
		}
	}
	return names, nil
}
