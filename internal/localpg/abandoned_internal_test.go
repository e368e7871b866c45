package localpg

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// A temporary cluster directory whose creator is gone (a test binary that
// panicked, a killed `onceflow dev`) is removed by the next Start; one whose
// creator lives, one that names none, and anything else in the temporary
// directory are kept.
func TestAbandonedClusterDirectoriesAreRemoved(t *testing.T) {
	t.Parallel()
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	tmp := t.TempDir()
	owners := map[string]string{ // directory → its owner file, "" for none
		tempDirPrefix + "abandoned": strconv.Itoa(gone.Process.Pid),
		tempDirPrefix + "live":      strconv.Itoa(os.Getpid()),
		tempDirPrefix + "unowned":   "",
		"not-a-cluster":             strconv.Itoa(gone.Process.Pid),
	}
	for name, owner := range owners {
		dir := filepath.Join(tmp, name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o700))
		if owner != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o600))
		}
	}

	removeAbandoned(tmp, slog.New(slog.DiscardHandler))

	for name := range owners {
		_, err := os.Stat(filepath.Join(tmp, name))
		if name == tempDirPrefix+"abandoned" {
			require.ErrorIs(t, err, os.ErrNotExist, name)
		} else {
			require.NoError(t, err, name)
		}
	}
}

// Start records its process as the owner of the directory it creates.
func TestStartRecordsTheDirectorysOwner(t *testing.T) {
	t.Parallel()
	c, err := Start(context.Background(), Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })
	owner, err := os.ReadFile(filepath.Join(c.dir, ownerFile))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid()), string(owner))
}
