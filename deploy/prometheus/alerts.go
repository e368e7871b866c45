// Package prometheus holds the compose demo's Prometheus alerting rules,
// embedded so that tests can check them against the metrics the services
// export.
package prometheus

import (
	"bytes"
	_ "embed"
	"fmt"

	"gopkg.in/yaml.v3"
)

//go:embed alerts.yml
var alerts []byte

// Rule is an alerting rule of alerts.yml.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// Rules returns the alerting rules of every group of alerts.yml. A key
// Rule does not know fails, as Prometheus refuses it.
func Rules() ([]Rule, error) {
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []Rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(alerts))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("read alerts.yml: %w", err)
	}
	var rules []Rule
	for _, g := range file.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules, nil
}
