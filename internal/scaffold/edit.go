package scaffold

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Paths of the existing files a new service is added to.
const (
	registryFile   = "internal/registry/registry.go"
	sqlcFile       = "sqlc.yaml"
	composeFile    = "docker-compose.yml"
	prometheusFile = "deploy/prometheus/prometheus.yml"
	streamsFile    = "internal/streams/streams.go"
)

// firstHostPort is the order API's port in the compose file and in
// onceflow dev; the i-th service listens on firstHostPort+i.
const firstHostPort = 8080

// editor computes the new contents of the existing files a service is
// added to, in memory.
type editor struct {
	root string
	// changed are the new contents, by path relative to root.
	changed map[string][]byte
}

func (e *editor) read(p string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(e.root, p))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b, nil
}

func (e *editor) set(p string, content []byte) {
	if e.changed == nil {
		e.changed = make(map[string][]byte)
	}
	e.changed[p] = content
}

// registryNames reads the services of internal/registry, in order: the
// packages of the Of(...) calls in Services.
func (e *editor) registryNames() ([]string, error) {
	src, err := e.read(registryFile)
	if err != nil {
		return nil, err
	}
	f, err := parser.ParseFile(token.NewFileSet(), registryFile, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", registryFile, err)
	}
	var names []string
	var found bool
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "Services" || fn.Body == nil {
			continue
		}
		found = true
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "Of" {
				return true
			}
			if sel, ok := call.Args[0].(*ast.SelectorExpr); ok {
				if pkg, ok := sel.X.(*ast.Ident); ok {
					names = append(names, pkg.Name)
				}
			}
			return false
		})
	}
	if !found || len(names) == 0 {
		return nil, fmt.Errorf("%s: no services found in its Services function; it is rendered from templates/registry.go.tmpl", registryFile)
	}
	return names, nil
}

// registry re-renders internal/registry/registry.go with the new service.
func (e *editor) registry(d data) error {
	src, err := render("registry.go.tmpl", d)
	if err != nil {
		return err
	}
	e.set(registryFile, src)
	return nil
}

// sqlcConfig is what the generator reads of sqlc.yaml.
type sqlcConfig struct {
	SQL []struct {
		Name    string `yaml:"name"`
		Queries any    `yaml:"queries"`
		Gen     struct {
			Go struct {
				Out string `yaml:"out"`
			} `yaml:"go"`
		} `yaml:"gen"`
	} `yaml:"sql"`
}

// sqlc appends the service's entry to sqlc.yaml, whose last key must be its
// list of entries.
func (e *editor) sqlc(d data) error {
	src, err := e.read(sqlcFile)
	if err != nil {
		return err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		return fmt.Errorf("parse %s: %w", sqlcFile, err)
	}
	if last := lastKey(&root); last != "sql" {
		return fmt.Errorf("%s: its last key is %q; the generator appends to the sql list, so keep that last", sqlcFile, last)
	}
	var cfg sqlcConfig
	if err := yaml.Unmarshal(src, &cfg); err != nil {
		return fmt.Errorf("parse %s: %w", sqlcFile, err)
	}
	out := "services/" + d.Name + "/internal/dbsqlc"
	for _, s := range cfg.SQL {
		if s.Name == d.Name || s.Gen.Go.Out == out {
			return fmt.Errorf("service %q exists: %s has its entry", d.Name, sqlcFile)
		}
	}
	entry, err := render("sqlc.yaml.tmpl", d)
	if err != nil {
		return err
	}
	next := append(slices.Clone(withNewline(src)), entry...)
	var check sqlcConfig
	if err := yaml.Unmarshal(next, &check); err != nil {
		return fmt.Errorf("%s with the new entry does not parse: %w", sqlcFile, err)
	}
	if len(check.SQL) != len(cfg.SQL)+1 || check.SQL[len(cfg.SQL)].Gen.Go.Out != out {
		return fmt.Errorf("%s: the appended entry did not land in the sql list; is the list indented as the template expects?", sqlcFile)
	}
	e.set(sqlcFile, next)
	return nil
}

// composeConfig is what the generator reads of docker-compose.yml.
type composeConfig struct {
	Services map[string]struct {
		Environment map[string]any `yaml:"environment"`
		Ports       []string       `yaml:"ports"`
	} `yaml:"services"`
}

// hostPorts are the host ports the compose services publish.
func (c composeConfig) hostPorts() map[int]bool {
	taken := make(map[int]bool)
	for _, s := range c.Services {
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			if len(parts) >= 2 {
				if n, err := strconv.Atoi(parts[len(parts)-2]); err == nil {
					taken[n] = true
				}
			}
		}
	}
	return taken
}

var passwordLine = regexp.MustCompile(`^(\s+)[A-Z][A-Z0-9_]*_DB_PASSWORD:`)

// compose appends the service to docker-compose.yml, whose last key must be
// services, and adds its database password to postgres's environment (the
// init script creates a database and a role for every <SERVICE>_DB_PASSWORD).
// It returns the host port it publishes the service on: the one onceflow
// dev gives it, unless taken.
func (e *editor) compose(d *data, index int) (int, error) {
	src, err := e.read(composeFile)
	if err != nil {
		return 0, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		return 0, fmt.Errorf("parse %s: %w", composeFile, err)
	}
	if last := lastKey(&root); last != "services" {
		return 0, fmt.Errorf("%s: its last key is %q; the generator appends to services, so keep that last", composeFile, last)
	}
	var cfg composeConfig
	if err := yaml.Unmarshal(src, &cfg); err != nil {
		return 0, fmt.Errorf("parse %s: %w", composeFile, err)
	}
	if _, ok := cfg.Services[d.Name]; ok {
		return 0, fmt.Errorf("service %q exists: %s has a service of that name", d.Name, composeFile)
	}
	if _, ok := cfg.Services["postgres"]; !ok {
		return 0, fmt.Errorf("%s: no postgres service", composeFile)
	}
	taken := cfg.hostPorts()
	d.HostPort = firstHostPort + index
	for taken[d.HostPort] {
		d.HostPort++
	}

	// The password, after the last one in postgres's block.
	lines := strings.SplitAfter(string(withNewline(src)), "\n")
	start := slices.Index(lines, "  postgres:\n")
	if start < 0 {
		return 0, fmt.Errorf("%s: no line \"  postgres:\" under services", composeFile)
	}
	at := -1
	var indent string
	for i := start + 1; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "   ") {
			break // the next service, or the end of services
		}
		if m := passwordLine.FindStringSubmatch(l); m != nil {
			at, indent = i, m[1]
		}
	}
	if at < 0 {
		return 0, fmt.Errorf("%s: postgres's environment has no <SERVICE>_DB_PASSWORD to add %s_DB_PASSWORD after", composeFile, d.EnvPrefix)
	}
	password, err := render("compose-password.yml.tmpl", *d)
	if err != nil {
		return 0, err
	}
	block, err := render("compose.yml.tmpl", *d)
	if err != nil {
		return 0, err
	}
	next := slices.Concat(lines[:at+1], []string{indent + string(password)}, lines[at+1:], []string{string(block)})
	out := []byte(strings.Join(next, ""))

	var check composeConfig
	if err := yaml.Unmarshal(out, &check); err != nil {
		return 0, fmt.Errorf("%s with the new service does not parse: %w", composeFile, err)
	}
	if _, ok := check.Services[d.Name]; !ok {
		return 0, fmt.Errorf("%s: the appended service did not land under services", composeFile)
	}
	if _, ok := check.Services["postgres"].Environment[d.EnvPrefix+"_DB_PASSWORD"]; !ok {
		return 0, fmt.Errorf("%s: the password did not land in postgres's environment", composeFile)
	}
	e.set(composeFile, out)
	return d.HostPort, nil
}

// prometheusConfig is what the generator reads of prometheus.yml.
type prometheusConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string          `yaml:"targets"`
			Labels  map[string]string `yaml:"labels"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// prometheus appends the service's /metrics to the targets of the compose
// demo's Prometheus, whose last job must list the services. A repository
// without that file is left so.
func (e *editor) prometheus(d data) error {
	if _, err := os.Stat(filepath.Join(e.root, prometheusFile)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	src, err := e.read(prometheusFile)
	if err != nil {
		return err
	}
	var before prometheusConfig
	if err := yaml.Unmarshal(src, &before); err != nil {
		return fmt.Errorf("parse %s: %w", prometheusFile, err)
	}
	target := d.Name + ":8080"
	if len(before.ScrapeConfigs) == 0 {
		return fmt.Errorf("%s: no scrape_configs", prometheusFile)
	}
	for _, sc := range before.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			if slices.Contains(st.Targets, target) {
				return fmt.Errorf("service %q exists: %s scrapes it", d.Name, prometheusFile)
			}
		}
	}
	entry, err := render("prometheus-target.yml.tmpl", d)
	if err != nil {
		return err
	}
	next := append(slices.Clone(withNewline(src)), entry...)
	var after prometheusConfig
	if err := yaml.Unmarshal(next, &after); err != nil {
		return fmt.Errorf("%s with the new target does not parse: %w", prometheusFile, err)
	}
	job := len(before.ScrapeConfigs) - 1
	if len(after.ScrapeConfigs) != len(before.ScrapeConfigs) ||
		len(after.ScrapeConfigs[job].StaticConfigs) != len(before.ScrapeConfigs[job].StaticConfigs)+1 ||
		!slices.Contains(after.ScrapeConfigs[job].StaticConfigs[len(before.ScrapeConfigs[job].StaticConfigs)].Targets, target) {
		return fmt.Errorf("%s: the appended target did not land in the last job's static_configs; keep the services' targets last", prometheusFile)
	}
	e.set(prometheusFile, next)
	return nil
}

// lastKey is the last key of a YAML document's top-level mapping.
func lastKey(doc *yaml.Node) string {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return ""
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode || len(m.Content) < 2 {
		return ""
	}
	return m.Content[len(m.Content)-2].Value
}

func withNewline(b []byte) []byte {
	if len(b) > 0 && !bytes.HasSuffix(b, []byte("\n")) {
		return append(slices.Clone(b), '\n')
	}
	return b
}

// streams declares the service's durables in internal/streams, beside the
// saga's — a constant each, after the last durable's, and an entry each at
// the end of streams.Saga's consumers — and the stream of the event it
// emits the same way. From there every service, provisioning and the
// auditor see them.
func (e *editor) streams(d data) error {
	if len(d.Subscriptions) == 0 && d.Emits == nil {
		return nil
	}
	src, fset, f, err := e.parse(streamsFile)
	if err != nil {
		return err
	}
	taken := stringConsts([]*ast.File{f}, "")
	refuse := func(ident, value string) error {
		for k, v := range taken {
			if k == ident || v == value {
				return fmt.Errorf("service %q: %s declares %s = %q already", d.Name, streamsFile, k, v)
			}
		}
		return nil
	}
	var ins insertions
	// Each list gets its entries at its end, their constants after the
	// constant of its last entry.
	for _, l := range []struct {
		list, key       string
		add             bool
		consts, entries string
	}{
		{"Streams", "Name", d.Emits != nil, "streams-stream-const.tmpl", "streams-stream.tmpl"},
		{"Consumers", "Durable", len(d.Subscriptions) > 0, "streams-durables.tmpl", "streams-consumers.tmpl"},
	} {
		if !l.add {
			continue
		}
		list := keyedList(f, "Saga", l.list)
		if list == nil || len(list.Elts) == 0 {
			return fmt.Errorf("%s: no %s list in Saga to add to", streamsFile, l.list)
		}
		last := list.Elts[len(list.Elts)-1]
		spec := specOf(f, field(last, l.key))
		if spec == nil {
			return fmt.Errorf("%s: no constant for the %s of Saga's last %s", streamsFile, l.key, l.list)
		}
		if err := ins.add(src, fset, spec.End(), l.consts, d); err != nil {
			return err
		}
		if err := ins.add(src, fset, last.End(), l.entries, d); err != nil {
			return err
		}
	}
	if d.Emits != nil {
		if err := refuse(d.Emits.Stream.Const, d.Emits.Stream.Name); err != nil {
			return err
		}
	}
	for _, s := range d.Subscriptions {
		if err := refuse(s.DurableConst, s.Durable); err != nil {
			return err
		}
	}
	return e.setFormatted(streamsFile, ins.apply(src))
}
