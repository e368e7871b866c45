package inbox_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// golden is the service the generator writes, checked in and kept equal to
// its templates by internal/scaffold's TestGoldenService.
const golden = "internal/scaffold/testdata/loyalty/"

// quote says where a snippet of the docs comes from: the snippet whose
// first line is first, in doc, is lines of code, as renamed by as.
type quote struct {
	doc, first, code string
	// as renames the code to the doc's example (payment's lines shown as
	// loyalty's), or nil.
	as *strings.Replacer
}

// asLoyalty shows payment's lines as the generator writes them for loyalty.
var asLoyalty = strings.NewReplacer("payment", "loyalty", "Payment", "Loyalty")

// quotes are every snippet of Go or YAML in the docs. The docs are read to
// be copied: a snippet that is not the code teaches what does not run.
var quotes = []quote{
	{"README.md", "func (s *Service) HandleOrderConfirmed(", golden + "services/loyalty/loyalty.go", nil},
	{"README.md", "func (c *Consumer) processOne(", "internal/inbox/process.go", nil},
	{"docs/new-service.md", "func TestMain(", golden + "services/loyalty/main_test.go", nil},
	{"docs/new-service.md", "func TestConformance(", golden + "services/loyalty/conformance_test.go", nil},
	{"docs/new-service.md", "- name: loyalty", "internal/scaffold/templates/sqlc.yaml.tmpl", strings.NewReplacer("{{.Name}}", "loyalty")},
	{"docs/new-service.md", "func Run(", golden + "services/loyalty/run.go", nil},
	{"docs/new-service.md", "PaymentOrders ", "internal/streams/streams.go", nil},
	{"docs/new-service.md", "func (s *Service) HandleOrderConfirmed(", golden + "services/loyalty/loyalty.go", nil},
	{"docs/new-service.md", "next, err := ev.Caused(", golden + "services/loyalty/loyalty.go", nil},
	{"docs/new-service.md", "Of(loyalty.Name,", "internal/registry/registry.go", asLoyalty},
	{"conformance/doc.go", "func TestMain(", golden + "services/loyalty/main_test.go", nil},
	{"conformance/doc.go", "func TestConformance(", golden + "services/loyalty/conformance_test.go", nil},
}

// TestTheDocsQuoteTheCodeAsItIs checks every Go and YAML snippet of the
// README, docs/ and the conformance kit's package doc against the code it
// quotes: its lines are the code's, in order and together, but for a line
// "…", which stands for any lines, and but for the indentation of lines
// nested deeper in the code. The names the Markdown quotes in its links
// are checked too (links).
func TestTheDocsQuoteTheCodeAsItIs(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	docs = append(docs, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "conformance", "doc.go"))
	seen := make(map[quote]bool)
	names := 0
	for _, p := range docs {
		doc, err := filepath.Rel(repoRoot, p)
		require.NoError(t, err)
		for _, s := range snippets(t, p) {
			q, ok := quoteOf(doc, s[0])
			require.True(t, ok, "%s: the snippet %q has no entry in quotes: add one naming the code it shows", doc, s[0])
			require.False(t, seen[q], "%s: two snippets start %q", doc, s[0])
			seen[q] = true
			code := string(readFile(t, q.code))
			if q.as != nil {
				code = q.as.Replace(code)
			}
			require.True(t, within(s, strings.Split(code, "\n")),
				"%s: the snippet %q is not %s as it is:\n%s", doc, s[0], q.code, strings.Join(s, "\n"))
		}
		if strings.HasSuffix(p, ".md") {
			names += links(t, p)
		}
	}
	require.Positive(t, names, "no name quoted in a link was checked")
	for _, q := range quotes {
		require.True(t, seen[q], "%s has no snippet %q any more: drop it from quotes", q.doc, q.first)
	}
}

var (
	// A Markdown link: its text and its target, less an anchor.
	linkRE = regexp.MustCompile(`\[([^\]]*)\]\(([^)#\s]*)(#[^)]*)?\)`)
	// A Go name in a code span, as the guarantee table cites a function or
	// a test: [`processOne`](internal/inbox/process.go).
	nameRE = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)`")
	// A Go name quoted as being in a linked file: `nextStatus` in
	// [order.go](../services/order/order.go).
	nameInRE = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)` in \\[[^\\]]*\\]\\(([^)#\\s]*\\.go)\\)")
)

// links checks the links of the Markdown file at p to the repository: the
// file or directory each names exists; each Go name quoted in the text of
// a link to a Go file is declared there (a function, a method, a type, a
// constant, a variable or the package); each name the doc says is "in" a
// linked Go file is declared or called there. A renamed test or function
// fails here, and not a reader. It returns how many names it checked.
func links(t *testing.T, p string) (names int) {
	t.Helper()
	doc := string(readFile(t, p))
	for _, m := range linkRE.FindAllStringSubmatch(doc, -1) {
		text, target := m[1], m[2]
		if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		_, err := os.Stat(filepath.Join(filepath.Dir(p), target))
		require.NoError(t, err, "%s: the link [%s](%s) leads nowhere", p, text, target)
		if strings.HasSuffix(target, ".go") {
			for _, name := range nameRE.FindAllStringSubmatch(text, -1) {
				requireIn(t, p, name[1], target, false)
				names++
			}
		}
	}
	for _, m := range nameInRE.FindAllStringSubmatch(doc, -1) {
		requireIn(t, p, m[1], m[2], true)
		names++
	}
	return names
}

// requireIn fails unless the Go file target, linked from the doc at p,
// declares name or, if called may do, calls it (`LockPayment` in
// payment.go, a method of its queries).
func requireIn(t *testing.T, p, name, target string, called bool) {
	t.Helper()
	code := string(readFile(t, filepath.Join(filepath.Dir(p), target)))
	in := `(?m)^(func (\([^)]*\) )?|type |package |\s*(const |var )?)` + name + `\b`
	if called {
		in += `|\.` + name + `\(`
	}
	require.True(t, regexp.MustCompile(in).MatchString(code), "%s: it quotes %s from %s, which does not have it", p, name, target)
}

// quoteOf is the quote of the snippet of doc that starts with first.
func quoteOf(doc, first string) (quote, bool) {
	for _, q := range quotes {
		if q.doc == doc && strings.HasPrefix(strings.TrimSpace(first), q.first) {
			return q, true
		}
	}
	return quote{}, false
}

// within reports whether snippet is lines of code, in order and together,
// but where the snippet says "…".
func within(snippet, code []string) bool {
	if len(snippet) == 0 {
		return true
	}
	if strings.TrimSpace(snippet[0]) == "…" {
		for i := range len(code) + 1 {
			if within(snippet[1:], code[i:]) {
				return true
			}
		}
		return false
	}
	for i := range code {
		if at(snippet, code[i:]) {
			return true
		}
	}
	return false
}

// at reports whether snippet is the lines at the start of code (a "…" in
// it standing for any lines), each indented alike: by as much more as its
// first line is, so a snippet may quote lines nested deeper in the code.
func at(snippet, code []string) bool {
	if len(code) == 0 {
		return false
	}
	pad, ok := strings.CutSuffix(code[0], snippet[0])
	if !ok || strings.TrimSpace(pad) != "" || strings.TrimSpace(snippet[0]) == "" {
		return false
	}
	for j, line := range snippet {
		switch {
		case strings.TrimSpace(line) == "…":
			return within(snippet[j+1:], code[j:])
		case j >= len(code):
			return false
		case line == "" && code[j] == "":
		case code[j] != pad+line:
			return false
		}
	}
	return true
}

// snippets are the Go and YAML snippets of the file at p: the fenced
// blocks of a Markdown file, the indented blocks of a Go doc comment.
func snippets(t *testing.T, p string) [][]string {
	t.Helper()
	var out [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(string(readFile(t, p))))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasSuffix(p, ".go") {
			body, ok := strings.CutPrefix(line, "//\t")
			switch {
			case ok:
				cur = append(cur, body)
			case cur != nil:
				out, cur = append(out, cur), nil
			}
			continue
		}
		switch {
		case !in && (line == "```go" || line == "```yaml"):
			in, cur = true, []string{}
		case in && line == "```":
			in, out, cur = false, append(out, cur), nil
		case in:
			cur = append(cur, line)
		}
	}
	require.NoError(t, sc.Err())
	require.False(t, in, "%s: a snippet is not closed", p)
	return out
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	if !filepath.IsAbs(p) && !strings.HasPrefix(p, repoRoot) {
		p = filepath.Join(repoRoot, p)
	}
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}
