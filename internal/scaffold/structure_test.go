package scaffold

import (
	"bytes"
	"errors"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/onceflow/onceflow/internal/registry"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// extras are the files a hand-written service has beyond the generator's,
// each with the reason it may.
var extras = map[string]map[string]string{
	"notify": {
		"mailer.go":      "the mailer that sends notify's own mail outbox over SMTP",
		"mailer_test.go": "the mailer's tests",
		"batch.go":       "the set-based form of its order milestone handler (inbox.BatchHandler), an optimisation",
		"batch_test.go":  "its tests",
		"retry.go":       "the operator's retry of FAILED e-mails (onceflow mail retry)",
	},
	"order": {
		"setup_test.go":   "test helpers shared by order's several test files",
		"batch.go":        "the set-based form of its handlers (inbox.BatchHandler), an optimisation",
		"batch_test.go":   "its tests",
		"admission.go":    "the admission control of POST /orders (MAX_ORDERS_IN_FLIGHT): the saga's entry point refuses work while the saga is behind, and each caller's orders past ORDER_RATE_LIMIT",
		"catalog.go":      "the product catalog, which prices an order's lines on the server",
		"catalog_test.go": "its tests",
		"cursor.go":       "the opaque cursor of GET /orders' pages",
		"auth_test.go":    "the tests of who may do what at order's HTTP edge",
		"expirer.go":      "the expirer that ends the orders past their deadline (ORDER_DEADLINE) with OrderExpired",
		"expirer_test.go": "its tests",
		"config_test.go":  "the tests of its settings' bounds",
	},
	"payment": {
		"batch.go":       "the set-based form of its OrderPlaced handler (inbox.BatchHandler), an optimisation",
		"batch_test.go":  "its tests",
		"expiry_test.go": "the tests of its compensation of an expired order",
	},
	"inventory": {
		"batch.go":       "the set-based form of its PaymentDebited handler (inbox.BatchHandler), an optimisation",
		"batch_test.go":  "its tests",
		"expiry.go":      "its compensation of an expired order: the release of its reservation",
		"expiry_test.go": "its tests",
	},
}

// extraEnv are the compose environment variables a hand-written service
// sets beyond the generator's, each with the reason it may.
var extraEnv = map[string]map[string]string{
	"notify": {
		"SMTP_ADDR": "the mailer sends to Mailpit",
		"MAIL_FROM": "the From of its e-mails",
	},
}

// templateData is what the generator would render a service named name
// with: consuming OrderConfirmed, as a typical consumer.
func templateData(t *testing.T, name string) data {
	t.Helper()
	cat, err := loadCatalog(repoRoot)
	require.NoError(t, err)
	events, err := resolveEvents(cat, []string{"OrderConfirmed"})
	require.NoError(t, err)
	return data{
		Name:          name,
		EnvPrefix:     strings.ToUpper(name),
		HostPort:      firstHostPort,
		Events:        events,
		Subscriptions: subscriptions(name, events),
	}
}

// TestServicesHaveTheGeneratedShape compares every registered service with
// what `onceflow new service` generates for its name: the same files (but
// the documented extras and the sqlc output, which follows the queries),
// the same exported run and config declarations, the same handler and
// route signatures, the same sqlc entry, compose service and test main. If
// they drift apart, either the template or the service is lying.
func TestServicesHaveTheGeneratedShape(t *testing.T) {
	t.Parallel()
	names := registry.Names()
	require.Equal(t, []string{"order", "payment", "inventory", "notify"}, names[:4], "the saga's four come first")
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := templateData(t, name)
			gen, err := renderService(d)
			require.NoError(t, err)
			dir := filepath.Join(repoRoot, "services", name)

			// The same files.
			want := []string{"internal/dbsqlc/db.go", "internal/dbsqlc/models.go"}
			for p := range gen {
				if rel, ok := strings.CutPrefix(p, "services/"+name+"/"); ok {
					want = append(want, rel)
				}
			}
			got := filesUnder(t, dir)
			for _, f := range want {
				require.Contains(t, got, f, "services/%s lacks %s, which the generator makes", name, f)
			}
			var queries int
			for _, f := range got {
				switch {
				case slices.Contains(want, f):
				case strings.HasPrefix(f, "internal/dbsqlc/") && strings.HasSuffix(f, ".sql.go"):
					queries++
				default:
					require.Contains(t, extras[name], f, "services/%s/%s is neither generated nor a documented extra", name, f)
				}
			}
			require.Positive(t, queries, "services/%s/internal/dbsqlc has no queries", name)
			requireGlob(t, filepath.Join(repoRoot, "db", "migrations", name, "00001_*.sql"))
			requireGlob(t, filepath.Join(repoRoot, "db", "queries", name, "*.sql"))

			// The same test main, to the byte.
			main, err := os.ReadFile(filepath.Join(dir, "main_test.go"))
			require.NoError(t, err)
			require.Equal(t, string(gen["services/"+name+"/main_test.go"]), string(main))

			// The same config and run: every exported declaration with the
			// same shape (the durables of both are in streams.Saga).
			for _, file := range []string{"config.go", "run.go"} {
				require.Equal(t, shapes(t, gen["services/"+name+"/"+file]),
					shapes(t, readFile(t, filepath.Join(dir, file))), "services/%s/%s", name, file)
			}
			require.Equal(t, runCall(t, gen["services/"+name+"/run.go"]), runCall(t, readFile(t, filepath.Join(dir, "run.go"))),
				"services/%s/run.go: Run is not one call of app.Run as the template's is", name)

			// The same service type, constructor, handler and route
			// signatures.
			own := shapes(t, readFile(t, filepath.Join(dir, name+".go")))
			genOwn := shapes(t, gen["services/"+name+"/"+name+".go"])
			for _, k := range []string{"Service", "New"} {
				require.Equal(t, genOwn[k], own[k], "services/%s/%s.go: %s", name, name, k)
			}
			handler := genOwn["Service.HandleOrderConfirmed"]
			var handlers int
			for k, shape := range own {
				if strings.HasPrefix(k, "Service.Handle") {
					handlers++
					require.Equal(t, handler, shape, "services/%s/%s.go: %s is not an inbox handler", name, name, k)
				}
			}
			require.Positive(t, handlers, "services/%s has no Handle methods", name)
			httpGo := readFile(t, filepath.Join(dir, "http.go"))
			require.Equal(t, shapes(t, gen["services/"+name+"/http.go"])["Service.Routes"], shapes(t, httpGo)["Service.Routes"])
			require.Contains(t, string(httpGo), "//go:embed openapi.yaml\nvar openAPI []byte")

			doc := readFile(t, filepath.Join(dir, "doc.go"))
			require.Contains(t, string(doc), "// Package "+name+" owns ")

			// The same sqlc entry, to the byte, and the same compose service.
			sqlcYAML := readFile(t, filepath.Join(repoRoot, sqlcFile))
			entry, err := render("sqlc.yaml.tmpl", d)
			require.NoError(t, err)
			require.Contains(t, string(sqlcYAML), string(entry), "sqlc.yaml: the entry of %s differs from the template's", name)
			requireComposeService(t, d)
			requirePrometheusTarget(t, d)
		})
	}
}

// TestRegistryIsRendered checks that internal/registry/registry.go is what
// the generator renders for the services it lists: the generator
// re-renders it, so a hand edit would be lost.
func TestRegistryIsRendered(t *testing.T) {
	t.Parallel()
	e := &editor{root: repoRoot}
	names, err := e.registryNames()
	require.NoError(t, err)
	require.Equal(t, registry.Names(), names)
	src, err := render("registry.go.tmpl", data{Services: names})
	require.NoError(t, err)
	require.Equal(t, string(src), string(readFile(t, filepath.Join(repoRoot, registryFile))),
		"internal/registry/registry.go differs from templates/registry.go.tmpl: edit both")
}

// requireComposeService compares the compose service of d.Name with the
// template's.
func requireComposeService(t *testing.T, d data) {
	t.Helper()
	type service struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
	}
	type compose struct {
		Services map[string]service `yaml:"services"`
	}
	var actual compose
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join(repoRoot, composeFile)), &actual))

	block, err := render("compose.yml.tmpl", d)
	require.NoError(t, err)
	password, err := render("compose-password.yml.tmpl", d)
	require.NoError(t, err)
	fragment := "services:\n" + strings.Replace(string(block), "    <<: *onceflow\n", "", 1) +
		"  postgres:\n    environment:\n      " + string(password)
	var want compose
	require.NoError(t, yaml.Unmarshal([]byte(fragment), &want), fragment)

	got, ok := actual.Services[d.Name]
	require.True(t, ok, "docker-compose.yml has no service %s", d.Name)
	require.Equal(t, "onceflow:dev", got.Image, "%s: not the onceflow image (<<: *onceflow)", d.Name)
	require.Equal(t, want.Services[d.Name].Command, got.Command)
	for k, v := range want.Services[d.Name].Environment {
		require.Equal(t, v, got.Environment[k], "%s: %s", d.Name, k)
	}
	for k := range got.Environment {
		if _, ok := want.Services[d.Name].Environment[k]; !ok {
			require.Contains(t, extraEnv[d.Name], k, "%s sets %s, which is neither generated nor a documented extra", d.Name, k)
		}
	}
	require.Len(t, got.Ports, 1)
	require.True(t, strings.HasSuffix(got.Ports[0], ":8080"), got.Ports[0])
	key := d.EnvPrefix + "_DB_PASSWORD"
	require.Equal(t, want.Services["postgres"].Environment[key], actual.Services["postgres"].Environment[key], "postgres: %s", key)
}

// requirePrometheusTarget checks that the compose demo's Prometheus scrapes
// d.Name as the template's target does.
func requirePrometheusTarget(t *testing.T, d data) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, prometheusFile))
	if errors.Is(err, os.ErrNotExist) {
		return // no observability profile
	}
	require.NoError(t, err)
	entry, err := render("prometheus-target.yml.tmpl", d)
	require.NoError(t, err)
	require.Contains(t, string(src), string(entry), "%s does not scrape %s as the template does", prometheusFile, d.Name)
}

// shapes describes the exported top-level declarations of a Go file, by
// name ("Type.Method" for methods): their kind and types, without names of
// parameters, bodies or comments.
func shapes(t *testing.T, src []byte) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution)
	require.NoError(t, err)
	str := func(n ast.Node) string {
		var b bytes.Buffer
		require.NoError(t, printer.Fprint(&b, fset, n))
		return b.String()
	}
	out := make(map[string]string)
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			key := d.Name.Name
			if d.Recv != nil {
				recv := d.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				key = str(recv) + "." + key
			}
			out[key] = "func" + str(withoutNames(d.Type))
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					shape := "type"
					if st, ok := s.Type.(*ast.StructType); ok {
						shape += " struct"
						for _, field := range st.Fields.List {
							if len(field.Names) == 0 {
								shape += " embeds " + str(field.Type)
							}
						}
					} else {
						shape += " " + str(s.Type)
					}
					out[s.Name.Name] = shape
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							out[n.Name] = d.Tok.String()
						}
					}
				}
			}
		}
	}
	return out
}

// withoutNames is ft with its parameters and results unnamed.
func withoutNames(ft *ast.FuncType) *ast.FuncType {
	strip := func(fl *ast.FieldList) *ast.FieldList {
		if fl == nil {
			return nil
		}
		out := &ast.FieldList{}
		for _, f := range fl.List {
			for range max(1, len(f.Names)) {
				out.List = append(out.List, &ast.Field{Type: f.Type})
			}
		}
		return out
	}
	return &ast.FuncType{Params: strip(ft.Params), Results: strip(ft.Results)}
}

// runCall is Run's body with the bodies of function literals elided: the
// one call of app.Run that every service's Run is.
func runCall(t *testing.T, src []byte) string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution)
	require.NoError(t, err)
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "Run" || fn.Recv != nil {
			continue
		}
		require.Len(t, fn.Body.List, 1, "Run is one statement")
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if lit, ok := n.(*ast.FuncLit); ok {
				lit.Body = &ast.BlockStmt{}
				return false
			}
			return true
		})
		var b bytes.Buffer
		require.NoError(t, printer.Fprint(&b, fset, fn.Body.List[0]))
		return b.String()
	}
	t.Fatal("no func Run")
	return ""
}

// filesUnder lists the files under dir, relative to it.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	}))
	return files
}

func requireGlob(t *testing.T, pattern string) {
	t.Helper()
	matches, err := filepath.Glob(pattern)
	require.NoError(t, err)
	require.NotEmpty(t, matches, "nothing matches %s", pattern)
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}
