package scaffold_test

import (
	"bytes"
	"crypto/sha256"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// copyRepo copies the repository's files — those git tracks or would
// track, as the working tree has them — into a new directory and returns
// it. Without git it copies everything but .git.
func copyRepo(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs(repoRoot)
	require.NoError(t, err)
	dst := t.TempDir()

	var files []string
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = src
	if out, err := cmd.Output(); err == nil {
		for f := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
			files = append(files, f)
		}
	} else {
		t.Logf("git ls-files: %v; copying every file but .git", err)
		require.NoError(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == ".git" || strings.HasPrefix(d.Name(), ".onceflow-new-")) {
				return filepath.SkipDir
			}
			if d.Type().IsRegular() {
				rel, err := filepath.Rel(src, p)
				files = append(files, rel)
				return err
			}
			return nil
		}))
	}
	for _, f := range files {
		info, err := os.Lstat(filepath.Join(src, f))
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the working tree, or not a file
		}
		b, err := os.ReadFile(filepath.Join(src, f))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Join(dst, filepath.Dir(f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dst, f), b, info.Mode().Perm()))
	}
	return dst
}

// snapshot is the content hash of every file under dir, by path.
func snapshot(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	sums := make(map[string][32]byte)
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		sums[rel] = sha256.Sum256(b)
		return err
	}))
	return sums
}

// goCmd runs the go command args in dir, with this process's environment
// (so the module and build caches are the ones of this test), and returns
// its combined output; it fails the test on an error.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return goCmdEnv(t, dir, nil, args...)
}

// sqlcGenerate runs `go tool sqlc generate` in dir as make generate does:
// sqlc built without cgo (see staging.go).
func sqlcGenerate(t *testing.T, dir string) {
	t.Helper()
	goCmdEnv(t, dir, []string{"CGO_ENABLED=0"}, "tool", "sqlc", "generate")
}

// goCmdEnv is goCmd with env added to this process's environment.
func goCmdEnv(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "go %s:\n%s", strings.Join(args, " "), out.String())
	return out.String()
}
