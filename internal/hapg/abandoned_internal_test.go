package hapg

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A cluster whose test binary died leaves its postmasters running, adopted
// by init: the next Start stops them and removes the directory. One whose
// owner lives is left alone.
func TestStartStopsTheServersOfAnAbandonedCluster(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	gone := exec.Command("true")
	require.NoError(t, gone.Run()) // its pid is free now

	abandoned := filepath.Join(tmp, tempDirPrefix+"abandoned")
	data := filepath.Join(abandoned, "node0", "data")
	require.NoError(t, os.MkdirAll(data, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(abandoned, ownerFile), []byte(strconv.Itoa(gone.Process.Pid)), 0o644))
	// A stand-in for a postmaster: a process working in the data directory.
	server := exec.Command("sleep", "300")
	server.Dir = data
	require.NoError(t, server.Start())
	exited := make(chan error, 1)
	go func() { exited <- server.Wait() }()
	t.Cleanup(func() { _ = server.Process.Kill() })

	live := filepath.Join(tmp, tempDirPrefix+"live")
	require.NoError(t, os.MkdirAll(live, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(live, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644))

	removeAbandoned(tmp, slog.New(slog.NewTextHandler(t.Output(), nil)))
	select {
	case err := <-exited:
		require.Error(t, err, "the abandoned server was killed")
	case <-time.After(30 * time.Second):
		t.Fatal("the abandoned server still runs")
	}
	require.NoDirExists(t, abandoned)
	require.DirExists(t, live)
}
