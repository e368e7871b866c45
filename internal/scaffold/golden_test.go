package scaffold

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/loyalty from the templates")

// goldenDir holds the service `onceflow new service loyalty --consumes
// OrderConfirmed --emits PointsAwarded` generates (but its sqlc output),
// checked in to be read: docs/new-service.md walks through it.
const goldenDir = "testdata/loyalty"

// TestGoldenService keeps testdata/loyalty equal to what the templates
// generate; after a change to the templates, run it with -update and read
// the diff.
func TestGoldenService(t *testing.T) {
	t.Parallel()
	d := templateData(t, "loyalty")
	cat, err := loadCatalog(repoRoot)
	require.NoError(t, err)
	d.Emits, err = resolveEmitted(cat, d.Name, "PointsAwarded", d.Events)
	require.NoError(t, err)
	files, err := renderService(d)
	require.NoError(t, err)

	if *update {
		require.NoError(t, os.RemoveAll(goldenDir))
		for p, content := range files {
			dst := filepath.Join(goldenDir, p)
			require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
			require.NoError(t, os.WriteFile(dst, content, 0o644))
		}
	}
	var golden []string
	require.NoError(t, filepath.WalkDir(goldenDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			golden = append(golden, filepath.ToSlash(strings.TrimPrefix(p, goldenDir+string(filepath.Separator))))
		}
		return err
	}))
	require.Len(t, golden, len(files), "%s holds other files than the generator makes (run with -update)", goldenDir)
	for p, content := range files {
		got, err := os.ReadFile(filepath.Join(goldenDir, p))
		require.NoError(t, err, "%s lacks %s (run with -update)", goldenDir, p)
		require.Equal(t, string(content), string(got), "%s/%s differs from the templates' (run with -update)", goldenDir, p)
	}
}
