package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// provisioning is what Grafana would have provisioned from the files.
type provisioning struct {
	datasources []datasource
	dashboards  []dashboard
}

// datasource is a provisioned data source, as /api/datasources shows it.
type datasource struct {
	ID        int            `json:"id" yaml:"-"`
	UID       string         `json:"uid" yaml:"uid"`
	OrgID     int            `json:"orgId" yaml:"-"`
	Name      string         `json:"name" yaml:"name"`
	Type      string         `json:"type" yaml:"type"`
	Access    string         `json:"access" yaml:"access"`
	URL       string         `json:"url" yaml:"url"`
	IsDefault bool           `json:"isDefault" yaml:"isDefault"`
	JSONData  map[string]any `json:"jsonData" yaml:"jsonData"`
	ReadOnly  bool           `json:"readOnly" yaml:"-"`
}

// dashboard is a provisioned dashboard: its model as the file has it.
type dashboard struct {
	id     int
	uid    string
	title  string
	tags   []string
	folder string
	file   string
	model  map[string]any
}

// dashboardProviders is a dashboards/ provisioning file.
type dashboardProviders struct {
	Providers []struct {
		Name    string `yaml:"name"`
		Folder  string `yaml:"folder"`
		Type    string `yaml:"type"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

// loadProvisioning reads dir's datasources/ and dashboards/ YAML files, as
// Grafana does at start-up (with $VAR and ${VAR} expanded from getenv),
// and the dashboards of every file provider.
func loadProvisioning(dir string, getenv func(string) string) (provisioning, error) {
	var p provisioning
	dsFiles, err := readYAML[struct {
		Datasources []datasource `yaml:"datasources"`
	}](filepath.Join(dir, "datasources"), getenv)
	if err != nil {
		return provisioning{}, err
	}
	for _, f := range dsFiles {
		p.datasources = append(p.datasources, f.Datasources...)
	}
	for i := range p.datasources {
		ds := &p.datasources[i]
		ds.ID, ds.OrgID, ds.ReadOnly = i+1, 1, true
		ds.UID = cmp.Or(ds.UID, ds.Name)
		ds.Access = cmp.Or(ds.Access, "proxy")
	}

	providerFiles, err := readYAML[dashboardProviders](filepath.Join(dir, "dashboards"), getenv)
	if err != nil {
		return provisioning{}, err
	}
	for _, f := range providerFiles {
		for _, pr := range f.Providers {
			if pr.Type != "" && pr.Type != "file" {
				continue
			}
			ds, err := loadDashboards(pr.Options.Path, pr.Folder)
			if err != nil {
				return provisioning{}, fmt.Errorf("dashboard provider %q: %w", pr.Name, err)
			}
			p.dashboards = append(p.dashboards, ds...)
		}
	}
	for i := range p.dashboards {
		p.dashboards[i].id = i + 1
		p.dashboards[i].model["id"] = i + 1
	}
	return p, nil
}

// readYAML decodes every .yaml and .yml file of dir, in name order, after
// expanding $VAR and ${VAR} from getenv ($$ is a literal $); a missing dir
// provisions nothing.
func readYAML[T any](dir string, getenv func(string) string) ([]T, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("provisioning: %w", err)
	}
	var files []T
	for _, e := range entries {
		if e.IsDir() || (!strings.HasSuffix(e.Name(), ".yaml") && !strings.HasSuffix(e.Name(), ".yml")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("provisioning: %w", err)
		}
		expanded := os.Expand(string(b), func(name string) string {
			if name == "$" {
				return "$"
			}
			return getenv(name)
		})
		var f T
		if err := yaml.Unmarshal([]byte(expanded), &f); err != nil {
			return nil, fmt.Errorf("provisioning %s: %w", e.Name(), err)
		}
		files = append(files, f)
	}
	return files, nil
}

// loadDashboards reads every .json file under dir as a dashboard of folder.
func loadDashboards(dir, folder string) ([]dashboard, error) {
	var ds []dashboard
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".json") {
			return err
		}
		d, err := readDashboard(path)
		if err != nil {
			return err
		}
		d.folder = folder
		ds = append(ds, d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dashboards in %s: %w", dir, err)
	}
	return ds, nil
}

func readDashboard(path string) (dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return dashboard{}, err
	}
	d := dashboard{file: path}
	if err := json.Unmarshal(b, &d.model); err != nil {
		return dashboard{}, fmt.Errorf("%s: %w", path, err)
	}
	d.uid, _ = d.model["uid"].(string)
	d.title, _ = d.model["title"].(string)
	if d.uid == "" || d.title == "" {
		return dashboard{}, fmt.Errorf("%s: a dashboard needs a uid and a title here", path)
	}
	tags, _ := d.model["tags"].([]any)
	for _, t := range tags {
		if s, ok := t.(string); ok {
			d.tags = append(d.tags, s)
		}
	}
	slices.Sort(d.tags)
	return d, nil
}
