package scaffold

import (
	"bytes"
	"embed"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
)

//go:embed templates
var templateFS embed.FS

// templates parses every template once, each named by its file name.
var templates = sync.OnceValues(func() (*template.Template, error) {
	return template.New("").Funcs(template.FuncMap{
		"eventList":    eventList,
		"quoteList":    quoteList,
		"owner":        owner,
		"lowerFirst":   lowerFirst,
		"sample":       sample,
		"durableConst": durableConst,
		"expiry":       func(e Event) bool { return e.Name == expiryEvent },
		"anyExpiry": func(es []Event) bool {
			return slices.ContainsFunc(es, func(e Event) bool { return e.Name == expiryEvent })
		},
	}).ParseFS(templateFS, "templates/*.tmpl", "templates/*/*.tmpl")
})

// serviceFiles maps the templates of a service's own files to their paths;
// NAME is the service's name.
var serviceFiles = []struct{ template, path string }{
	{"doc.go.tmpl", "services/NAME/doc.go"},
	{"config.go.tmpl", "services/NAME/config.go"},
	{"run.go.tmpl", "services/NAME/run.go"},
	{"service.go.tmpl", "services/NAME/NAME.go"},
	{"http.go.tmpl", "services/NAME/http.go"},
	{"openapi.yaml.tmpl", "services/NAME/openapi.yaml"},
	{"main_test.go.tmpl", "services/NAME/main_test.go"},
	{"service_test.go.tmpl", "services/NAME/NAME_test.go"},
	{"http_test.go.tmpl", "services/NAME/http_test.go"},
	{"conformance_test.go.tmpl", "services/NAME/conformance_test.go"},
	{"migration.sql.tmpl", "db/migrations/NAME/00001_NAME.sql"},
	{"queries.sql.tmpl", "db/queries/NAME/NAME.sql"},
}

// renderService renders the service's own files, by path relative to the
// root.
func renderService(d data) (map[string][]byte, error) {
	files := make(map[string][]byte, len(serviceFiles))
	for _, f := range serviceFiles {
		out, err := render(f.template, d)
		if err != nil {
			return nil, err
		}
		files[strings.ReplaceAll(f.path, "NAME", d.Name)] = out
	}
	return files, nil
}

// render executes the template name with d; Go source comes out gofmt'ed.
func render(name string, d data) ([]byte, error) {
	tmpl, err := templates()
	if err != nil {
		return nil, fmt.Errorf("parse the templates: %w", err)
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, name, d); err != nil {
		return nil, fmt.Errorf("render %s: %w", name, err)
	}
	if !strings.HasSuffix(name, ".go.tmpl") {
		return buf.Bytes(), nil
	}
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("render %s: the template made invalid Go: %w\n%s", name, err, buf.Bytes())
	}
	return src, nil
}

// checkImports refuses a name that would shadow a package the generated
// code imports (a service named "event" could not import internal/event).
func checkImports(name string, files map[string][]byte, registry []byte) error {
	sources := map[string][]byte{"internal/registry/registry.go": registry}
	for p, src := range files {
		if strings.HasSuffix(p, ".go") {
			sources[p] = src
		}
	}
	own := Module + "/services/" + name
	for p, src := range sources {
		f, err := parser.ParseFile(token.NewFileSet(), p, src, parser.ImportsOnly)
		if err != nil {
			return fmt.Errorf("parse generated %s: %w", p, err)
		}
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			local := path.Base(ip)
			if imp.Name != nil {
				local = imp.Name.Name
			}
			if local == name && ip != own {
				return fmt.Errorf("service name %q: taken by the package %s, which the generated %s imports", name, ip, p)
			}
		}
	}
	return nil
}

// eventList says "A", "A and B" or "A, B and C".
func eventList(events []Event) string {
	names := make([]string, len(events))
	for i, e := range events {
		names[i] = e.Name
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// quoteList is the elements of a Go []string literal.
func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

func lowerFirst(s string) string { return strings.ToLower(s[:1]) + s[1:] }

// sample is a Go literal of a valid payload of e for the generated tests,
// about orderID and customer: the order, one line of 2 × 150 cents where
// the payload has lines, and 300 cents in every amount.
func sample(e Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "event.%s{", e.Payload)
	for _, f := range e.Fields {
		switch {
		case f == "Order":
			b.WriteString("Order: event.Order{OrderID: orderID, CustomerID: customer}, ")
		case f == "Lines":
			b.WriteString(`Lines: event.Lines{{SKU: "apple", Quantity: 2, UnitPriceCents: 150}}, `)
		case strings.HasSuffix(f, "Cents"):
			fmt.Fprintf(&b, "%s: 300, ", f)
		case f == "Reason":
			b.WriteString(`Reason: "a test", `)
		case f == "Deadline":
			b.WriteString("Deadline: time.Now(), ")
		}
	}
	return strings.TrimSuffix(b.String(), ", ") + "}"
}

// owner is the service that owns an event type, "onceflow.<owner>.…": the
// ce-source the inbox's owner check wants.
func owner(typ string) string {
	parts := strings.Split(typ, ".")
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}
