package scaffold

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheDocsListTheExtras keeps docs/new-service.md's table of the files a
// hand-written service may have beyond the generator's equal to extras, the
// list the structure test allows: a reader told "nothing else without a
// reason" is shown every exception and its reason.
func TestTheDocsListTheExtras(t *testing.T) {
	t.Parallel()
	const header = "| service | file | why it may be there |\n|---|---|---|\n"
	doc := string(readFile(t, filepath.Join(repoRoot, "docs", "new-service.md")))
	i := strings.Index(doc, header)
	require.GreaterOrEqual(t, i, 0, "docs/new-service.md has no table of the extras")
	table, _, _ := strings.Cut(doc[i+len(header):], "\n\n")

	var want []string
	for name, files := range extras {
		for file, why := range files {
			want = append(want, fmt.Sprintf("| %s | `%s` | %s |", name, file, why))
		}
	}
	got := strings.Split(table, "\n")
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got, "docs/new-service.md: the table of extras differs from structure_test.go's extras")
}
