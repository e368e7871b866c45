package scaffold

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Paths of the files a new event type is added to.
const (
	eventTypesFile    = "internal/event/types.go"
	eventPayloadsFile = "internal/event/payloads.go"
	eventTestFile     = "internal/event/event_test.go"
)

// Emitted is the event type a generated service emits: a new one, added to
// internal/event and published on a stream of the service's own.
type Emitted struct {
	// Name is its constant in package event, e.g. PointsAwarded.
	Name string
	// Type is the CloudEvents type, e.g. onceflow.loyalty.points_awarded.v1.
	Type string
	// Subject is the NATS subject it is published on, e.g.
	// loyalty.points_awarded.v1.
	Subject string
	// Payload is its payload struct, e.g. PointsAwardedV1.
	Payload string
	// Stream is the service's stream, e.g. LOYALTY (constant Loyalty),
	// which holds the subjects NAME.>.
	Stream Stream
}

var validEventName = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// resolveEmitted describes the event type name that service emits, which
// must be new; "" emits nothing.
func resolveEmitted(cat catalog, service, name string, consumed []Event) (*Emitted, error) {
	if name == "" {
		return nil, nil
	}
	if !validEventName.MatchString(name) {
		return nil, fmt.Errorf("emitted event %q: want an exported Go identifier, e.g. PointsAwarded", name)
	}
	if _, err := cat.lookup(name); err == nil {
		return nil, fmt.Errorf("emitted event %s exists; a service emits events of its own", name)
	}
	if !slices.ContainsFunc(consumed, func(e Event) bool { return e.Name != expiryEvent }) {
		return nil, fmt.Errorf("emitted event %s: the generated handler emits it for each event consumed but %s, which it compensates; name one with --consumes", name, expiryEvent)
	}
	snake := snakeCase(name)
	return &Emitted{
		Name:    name,
		Type:    "onceflow." + service + "." + snake + ".v1",
		Subject: service + "." + snake + ".v1",
		Payload: name + "V1",
		Stream:  Stream{Name: strings.ToUpper(service), Const: titleCase(service)},
	}, nil
}

// snakeCase turns PointsAwarded into points_awarded.
func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// event adds the emitted event type to internal/event: its constant, its
// place in Types and NATSSubject, its payload, and its contract test.
func (e *editor) event(d data) error {
	if d.Emits == nil {
		return nil
	}
	src, fset, f, err := e.parse(eventTypesFile)
	if err != nil {
		return err
	}
	for ident := range stringConsts([]*ast.File{f}, "") {
		if ident == d.Emits.Name {
			return fmt.Errorf("emitted event %s exists in %s", ident, eventTypesFile)
		}
	}
	var ins insertions
	lastType := lastConstOfType(f, "Type")
	types := returnedList(f, "Types")
	subjects := switchOf(f, "NATSSubject")
	if lastType == nil || types == nil || subjects == nil || len(types.Elts) == 0 || len(subjects.Body.List) == 0 {
		return fmt.Errorf("%s: want its Type constants, Types' list and NATSSubject's switch to add %s to", eventTypesFile, d.Emits.Name)
	}
	if err := ins.add(src, fset, lastType.End(), "event-const.tmpl", d); err != nil {
		return err
	}
	if err := ins.add(src, fset, types.Elts[len(types.Elts)-1].End(), "event-types.tmpl", d); err != nil {
		return err
	}
	if err := ins.add(src, fset, subjects.Body.List[len(subjects.Body.List)-1].End(), "event-subject.tmpl", d); err != nil {
		return err
	}
	if err := e.setFormatted(eventTypesFile, ins.apply(src)); err != nil {
		return err
	}
	for file, tmpl := range map[string]string{eventPayloadsFile: "event-payload.tmpl", eventTestFile: "event-test.tmpl"} {
		src, err := e.read(file)
		if err != nil {
			return err
		}
		add, err := render(tmpl, d)
		if err != nil {
			return err
		}
		if err := e.setFormatted(file, append(withNewline(src), add...)); err != nil {
			return err
		}
	}
	return nil
}

// parse reads and parses the Go file p.
func (e *editor) parse(p string) ([]byte, *token.FileSet, *ast.File, error) {
	src, err := e.read(p)
	if err != nil {
		return nil, nil, nil, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse %s: %w", p, err)
	}
	return src, fset, f, nil
}

// setFormatted sets p's new content, gofmt'ed.
func (e *editor) setFormatted(p string, src []byte) error {
	out, err := format.Source(src)
	if err != nil {
		return fmt.Errorf("%s as edited: %w", p, err)
	}
	e.set(p, out)
	return nil
}

// insertions are texts to insert into a source file, each at the end of a
// line.
type insertions []struct {
	offset int
	text   []byte
}

// add renders tmpl with d, to be inserted at the end of the line of pos.
func (ins *insertions) add(src []byte, fset *token.FileSet, pos token.Pos, tmpl string, d data) error {
	text, err := render(tmpl, d)
	if err != nil {
		return err
	}
	*ins = append(*ins, struct {
		offset int
		text   []byte
	}{lineEnd(src, fset.Position(pos).Offset), bytes.TrimRight(text, "\n")})
	return nil
}

// apply returns src with the insertions made, back to front so that each
// offset still holds.
func (ins insertions) apply(src []byte) []byte {
	out := slices.Clone(src)
	sorted := slices.Clone(ins)
	slices.SortStableFunc(sorted, func(a, b struct {
		offset int
		text   []byte
	}) int {
		return b.offset - a.offset
	})
	for _, in := range sorted {
		out = slices.Insert(out, in.offset, in.text...)
	}
	return out
}

// lineEnd is the offset of the end of the line that holds offset.
func lineEnd(src []byte, offset int) int {
	if i := bytes.IndexByte(src[offset:], '\n'); i >= 0 {
		return offset + i
	}
	return len(src)
}

// lastConstOfType is the last constant declared with type typ.
func lastConstOfType(f *ast.File, typ string) *ast.ValueSpec {
	var last *ast.ValueSpec
	for vs := range constSpecs(f) {
		if id, ok := vs.Type.(*ast.Ident); ok && id.Name == typ {
			last = vs
		}
	}
	return last
}

// specOf is the declaration of constant ident.
func specOf(f *ast.File, ident string) *ast.ValueSpec {
	for vs := range constSpecs(f) {
		for _, n := range vs.Names {
			if n.Name == ident {
				return vs
			}
		}
	}
	return nil
}

// topStmt is the first statement of type T in the body of the function or
// method name, and whether there is one.
func topStmt[T ast.Stmt](f *ast.File, name string) (T, bool) {
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != name || fn.Body == nil {
			continue
		}
		for _, stmt := range fn.Body.List {
			if s, ok := stmt.(T); ok {
				return s, true
			}
		}
	}
	var zero T
	return zero, false
}

// returnedList is the composite literal function name returns.
func returnedList(f *ast.File, name string) *ast.CompositeLit {
	ret, ok := topStmt[*ast.ReturnStmt](f, name)
	if !ok || len(ret.Results) != 1 {
		return nil
	}
	lit, _ := ret.Results[0].(*ast.CompositeLit)
	return lit
}

// switchOf is the first switch statement of function name.
func switchOf(f *ast.File, name string) *ast.SwitchStmt {
	sw, _ := topStmt[*ast.SwitchStmt](f, name)
	return sw
}

// keyedList is the composite literal that is the value of key in the
// composite literal function name returns.
func keyedList(f *ast.File, name, key string) *ast.CompositeLit {
	var list *ast.CompositeLit
	if ret := returnedList(f, name); ret != nil {
		for _, elt := range ret.Elts {
			if kv, ok := elt.(*ast.KeyValueExpr); ok && fmt.Sprint(kv.Key) == key {
				list, _ = kv.Value.(*ast.CompositeLit)
			}
		}
	}
	return list
}

// field is the expression of key in the keyed composite literal lit, as
// source ("" when absent).
func field(lit ast.Expr, key string) string {
	cl, ok := lit.(*ast.CompositeLit)
	if !ok {
		return ""
	}
	for _, elt := range cl.Elts {
		if kv, ok := elt.(*ast.KeyValueExpr); ok && fmt.Sprint(kv.Key) == key {
			return fmt.Sprint(kv.Value)
		}
	}
	return ""
}
