package scaffold

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"iter"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// Event is an event type a generated service can consume.
type Event struct {
	// Name is the constant of the type in package event, e.g. OrderConfirmed.
	Name string
	// Type is the CloudEvents type, e.g. onceflow.order.confirmed.v1.
	Type string
	// Subject is the NATS subject it is published on.
	Subject string
	// Payload is its payload struct in package event, e.g. OrderConfirmedV1.
	Payload string
	// Fields are the payload's fields, embedded ones by their type name.
	Fields []string
	// Stream is the stream that holds Subject.
	Stream Stream
}

// Stream is a stream of the saga's topology.
type Stream struct {
	// Name is the stream's name, e.g. ORDERS.
	Name string
	// Const is its constant in package streams, e.g. Orders.
	Const string
}

// catalog is what the repository offers to consume: its event types, read
// from the source of internal/event and internal/streams so that the names
// in the generated code are the ones the repository declares.
type catalog struct {
	events []Event
}

// loadCatalog reads the event catalog of the repository at root. Subjects
// and streams come from this binary's internal/event and internal/streams,
// which are the repository's own when onceflow runs from it.
func loadCatalog(root string) (catalog, error) {
	eventFiles, err := parseDir(filepath.Join(root, "internal", "event"))
	if err != nil {
		return catalog{}, err
	}
	streamFiles, err := parseDir(filepath.Join(root, "internal", "streams"))
	if err != nil {
		return catalog{}, err
	}
	streamConsts := stringConsts(streamFiles, "")
	structs := structFields(eventFiles)

	var c catalog
	for name, typ := range stringConsts(eventFiles, "Type") {
		subject, err := event.Type(typ).NATSSubject()
		if err != nil {
			continue // declared in the repository, unknown to this binary
		}
		e := Event{Name: name, Type: typ, Subject: subject}
		version := typ[strings.LastIndex(typ, ".")+1:] // "v1"
		e.Payload = name + strings.ToUpper(version)
		fields, ok := structs[e.Payload]
		if !ok {
			return catalog{}, fmt.Errorf("event %s: no payload struct %s in internal/event", name, e.Payload)
		}
		e.Fields = fields
		stream, err := streamOf(subject)
		if err != nil {
			return catalog{}, fmt.Errorf("event %s: %w", name, err)
		}
		e.Stream = Stream{Name: stream}
		for ident, value := range streamConsts {
			if value == stream {
				e.Stream.Const = ident
			}
		}
		if e.Stream.Const == "" {
			return catalog{}, fmt.Errorf("event %s: no constant for stream %s in internal/streams", name, stream)
		}
		c.events = append(c.events, e)
	}
	slices.SortFunc(c.events, func(a, b Event) int { return strings.Compare(a.Name, b.Name) })
	if len(c.events) == 0 {
		return catalog{}, errors.New("no event types found in internal/event")
	}
	return c, nil
}

// lookup finds an event by its constant's name or its CloudEvents type.
func (c catalog) lookup(name string) (Event, error) {
	for _, e := range c.events {
		if e.Name == name || e.Type == name {
			return e, nil
		}
	}
	names := make([]string, len(c.events))
	for i, e := range c.events {
		names[i] = e.Name
	}
	return Event{}, fmt.Errorf("unknown event %q (want one of %s)", name, strings.Join(names, ", "))
}

// streamOf is the saga stream whose subjects hold subject.
func streamOf(subject string) (string, error) {
	for _, s := range streams.Saga(streams.Config{}).Streams {
		for _, pattern := range s.Subjects {
			if prefix, ok := strings.CutSuffix(pattern, ">"); ok && strings.HasPrefix(subject, prefix) {
				return s.Name, nil
			}
			if pattern == subject {
				return s.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no stream holds subject %s", subject)
}

// parseDir parses the non-test Go files of dir.
func parseDir(dir string) ([]*ast.File, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", p, err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no Go files in %s", dir)
	}
	return files, nil
}

// stringConsts returns the exported string constants of files, by name;
// with typ set, only those declared with that type.
func stringConsts(files []*ast.File, typ string) map[string]string {
	consts := make(map[string]string)
	for _, f := range files {
		for vs := range constSpecs(f) {
			if typ != "" {
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typ {
					continue
				}
			}
			for i, name := range vs.Names {
				if !name.IsExported() || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				if v, err := strconv.Unquote(lit.Value); err == nil {
					consts[name.Name] = v
				}
			}
		}
	}
	return consts
}

// constSpecs yields the constant declarations of f, in order.
func constSpecs(f *ast.File) iter.Seq[*ast.ValueSpec] {
	return func(yield func(*ast.ValueSpec) bool) {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				if !yield(spec.(*ast.ValueSpec)) {
					return
				}
			}
		}
	}
}

// structFields returns the field names of each struct type of files;
// embedded fields are named by their type.
func structFields(files []*ast.File) map[string][]string {
	structs := make(map[string][]string)
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			var fields []string
			for _, field := range st.Fields.List {
				if len(field.Names) == 0 {
					if id, ok := field.Type.(*ast.Ident); ok {
						fields = append(fields, id.Name)
					}
					continue
				}
				for _, n := range field.Names {
					fields = append(fields, n.Name)
				}
			}
			structs[ts.Name.Name] = fields
			return false
		})
	}
	return structs
}
