package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheReadmeListsEveryCommand keeps the README's table of commands equal
// to the commands onceflow has: a command added without a line there fails
// here, as does a line for a command that is gone.
func TestTheReadmeListsEveryCommand(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	_, table, ok := strings.Cut(readme, "| command | what it does |\n|---|---|\n")
	require.True(t, ok, "README.md has no table of the commands")
	table, _, _ = strings.Cut(table, "\n\n")
	var listed []string
	for row := range strings.SplitSeq(table, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " | ")
		for _, m := range regexp.MustCompile("`onceflow ([a-z-]+)").FindAllStringSubmatch(first, -1) {
			if !slices.Contains(listed, m[1]) {
				listed = append(listed, m[1])
			}
		}
	}
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	slices.Sort(names)
	slices.Sort(listed)
	require.Equal(t, names, listed, "README.md: the table of commands differs from commands()")
}

// generated is the service the docs scaffold as their example (onceflow new
// service loyalty): its command exists once it is generated.
const generated = "loyalty"

// withSubcommands are the commands whose first argument names a
// subcommand with flags of its own. Only these are asked for the help of
// a second word: another command would take it as an argument, and run.
var withSubcommands = []string{"dlq", "consumer", "mail", "outbox", "new"}

// TestTheDocsNameRealCommandsAndFlags reads every `onceflow …` of the
// README and docs/ (in code spans and code blocks) and checks that its
// command is one of onceflow's and that each --flag after it is one its
// help lists: a runbook that names a flag the binary does not have fails
// the operator when it matters. Each `make TARGET` is one of the
// Makefile's.
func TestTheDocsNameRealCommandsAndFlags(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	paths = append(paths, filepath.Join(repoRoot, "README.md"))
	invocation := regexp.MustCompile(`\bonceflow ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?`)
	flagRE := regexp.MustCompile(`(?:^|\s|\[)--([a-z][a-z-]*)`)
	makeRE := regexp.MustCompile(`\bmake (?:-s )?([a-z][a-z-]*)`)
	makefile := readDoc(t, "Makefile")
	var checked int
	for _, p := range paths {
		for _, span := range codeOf(readDoc(t, p)) {
			span, _, _ = strings.Cut(span, " #") // a shell comment is prose
			for _, m := range makeRE.FindAllStringSubmatch(span, -1) {
				require.Regexp(t, `(?m)^`+m[1]+`:`, makefile, "%s: `make %s` is no target of the Makefile (in %q)", filepath.Base(p), m[1], span)
				checked++
			}
			// One invocation runs to the next one.
			locs := invocation.FindAllStringSubmatchIndex(span, -1)
			for i, loc := range locs {
				end := len(span)
				if i+1 < len(locs) {
					end = locs[i+1][0]
				}
				rest := span[loc[1]:end]
				cmd, sub := span[loc[2]:loc[3]], ""
				if loc[4] >= 0 {
					sub = span[loc[4]:loc[5]]
				}
				name := filepath.Base(p)
				if cmd == generated {
					continue
				}
				if cmd == "help" {
					if sub == "" {
						continue // help alone, or of a placeholder (COMMAND)
					}
					cmd, sub = sub, ""
				}
				require.True(t, isCommand(cmd), "%s: `onceflow %s` is not a command (in %q)", name, cmd, span)
				for _, f := range flagRE.FindAllStringSubmatch(rest, -1) {
					require.True(t, hasFlag(t, cmd, sub, f[1]), "%s: `onceflow %s %s` has no flag --%s (in %q)", name, cmd, sub, f[1], span)
					checked++
				}
			}
		}
	}
	require.Positive(t, checked, "no flag of the docs was checked")
}

// isCommand reports whether name is a command of onceflow's.
func isCommand(name string) bool {
	return slices.ContainsFunc(commands(), func(c command) bool { return c.name == name })
}

// hasFlag reports whether the help of cmd (and of its subcommand sub,
// where it has subcommands) lists flag.
func hasFlag(t *testing.T, cmd, sub, flag string) bool {
	t.Helper()
	var help bytes.Buffer
	// Errors are not the question: a command that cannot print its help
	// lists no flag.
	_ = Run(t.Context(), []string{cmd, "-h"}, &help, io.Discard)
	if slices.Contains(withSubcommands, cmd) && sub != "" {
		_ = Run(t.Context(), []string{cmd, sub, "-h"}, &help, io.Discard)
	}
	return regexp.MustCompile(`(?m)(^|[\s\[|])--?` + regexp.QuoteMeta(flag) + `\b`).Match(help.Bytes())
}

// codeOf is the code of a Markdown document: each line of its fenced
// blocks, and each inline code span (which may wrap across lines).
func codeOf(doc string) []string {
	var code []string
	var prose strings.Builder
	in := false
	for line := range strings.SplitSeq(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			in = !in
		case in:
			code = append(code, line)
		default:
			prose.WriteString(line + " ")
		}
	}
	for _, m := range regexp.MustCompile("(`+)(.+?)`+").FindAllStringSubmatch(prose.String(), -1) {
		code = append(code, strings.ReplaceAll(m[2], `\|`, "|"))
	}
	return code
}

func readDoc(t *testing.T, p string) string {
	t.Helper()
	if !strings.HasPrefix(p, repoRoot) {
		p = filepath.Join(repoRoot, p)
	}
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(b)
}
