package scaffold

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// staging is a directory inside the repository where a service is rendered
// and generated before it is moved into place: inside, so that the moves
// are renames on one file system; hidden (a leading dot), so that `go`
// patterns like ./... never see it.
type staging struct {
	root string // the repository
	dir  string // the staging directory
	tree string // dir/tree, laid out like the repository
	// failAfter, when positive, fails the commit after that many moves:
	// the tests' way to fail halfway.
	failAfter int
}

func newStaging(root string) (*staging, error) {
	dir, err := os.MkdirTemp(root, ".onceflow-new-")
	if err != nil {
		return nil, fmt.Errorf("staging directory: %w", err)
	}
	return &staging{root: root, dir: dir, tree: filepath.Join(dir, "tree")}, nil
}

func (s *staging) remove() { _ = os.RemoveAll(s.dir) }

// write writes files, by path relative to the root, into the tree.
func (s *staging) write(files map[string][]byte) error {
	for p, content := range files {
		if err := writeFile(filepath.Join(s.tree, p), content, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// sqlc runs `go tool sqlc generate` on the service's entry of sqlcYAML (the
// new sqlc.yaml) alone, in the tree, and returns the files it wrote,
// relative to the root. The entry is the one the repository's sqlc.yaml
// will hold, with its anchors resolved, so the code is what
// `go tool sqlc generate` on the whole file writes (and `sqlc diff` agrees).
func (s *staging) sqlc(ctx context.Context, goCmd, name string, sqlcYAML []byte) ([]string, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(sqlcYAML, &cfg); err != nil {
		return nil, fmt.Errorf("parse sqlc.yaml: %w", err)
	}
	entries, _ := cfg["sql"].([]any)
	var entry any
	for _, e := range entries {
		if m, ok := e.(map[string]any); ok && m["name"] == name {
			entry = e
		}
	}
	if entry == nil {
		return nil, fmt.Errorf("sqlc.yaml: no entry %s", name)
	}
	one, err := yaml.Marshal(map[string]any{"version": cfg["version"], "sql": []any{entry}})
	if err != nil {
		return nil, err
	}
	config := filepath.Join(s.tree, "sqlc.yaml")
	if err := writeFile(config, one, 0o644); err != nil {
		return nil, err
	}
	// The entry reads the platform migrations too.
	platform := filepath.Join("db", "migrations", "platform")
	if err := copyDir(filepath.Join(s.root, platform), filepath.Join(s.tree, platform)); err != nil {
		return nil, err
	}

	cmd := exec.CommandContext(ctx, goCmd, "tool", "sqlc", "generate", "-f", config)
	cmd.Dir = s.root // `go tool` runs the sqlc that go.mod pins
	// Without cgo, sqlc parses PostgreSQL with its WebAssembly build of
	// libpg_query: the same code comes out, its first build takes a minute
	// and a half of CPU instead of four of C, and no C compiler is needed.
	// make generate and CI's sqlc diff build it the same way.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go tool sqlc generate: %w\n%s", err, out)
	}

	var files []string
	gen := filepath.Join("services", name, "internal", "dbsqlc")
	err = filepath.WalkDir(filepath.Join(s.tree, gen), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(s.tree, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sqlc generated nothing in %s: %w", gen, err)
	}
	return files, nil
}

// commit moves dirs from the tree into the repository and replaces each
// changed file by its new content. Each step is a rename; if one fails, the
// steps made are undone.
func (s *staging) commit(dirs []string, changed map[string][]byte) (err error) {
	var undo []func() error
	defer func() {
		if err == nil {
			return
		}
		for _, u := range slices.Backward(undo) {
			if uerr := u(); uerr != nil {
				err = errors.Join(err, fmt.Errorf("undo: %w", uerr))
			}
		}
	}()
	step := func() error {
		if s.failAfter > 0 && len(undo) >= s.failAfter {
			return errors.New("failing on purpose (test)")
		}
		return nil
	}

	// The new contents are staged first, so that replacing each is a rename.
	paths := slices.Sorted(maps.Keys(changed))
	for _, p := range paths {
		if err := writeFile(filepath.Join(s.dir, "changed", p), changed[p], 0o644); err != nil {
			return err
		}
	}
	for _, d := range dirs {
		if err := step(); err != nil {
			return err
		}
		dst := filepath.Join(s.root, d)
		if _, err := os.Lstat(dst); err == nil {
			return fmt.Errorf("%s appeared meanwhile", d)
		}
		if err := os.Rename(filepath.Join(s.tree, d), dst); err != nil {
			return fmt.Errorf("move %s into place: %w", d, err)
		}
		undo = append(undo, func() error { return os.RemoveAll(dst) })
	}
	for _, p := range paths {
		if err := step(); err != nil {
			return err
		}
		dst := filepath.Join(s.root, p)
		info, err := os.Stat(dst)
		if err != nil {
			return err
		}
		orig, err := os.ReadFile(dst)
		if err != nil {
			return err
		}
		staged := filepath.Join(s.dir, "changed", p)
		if err := os.Chmod(staged, info.Mode().Perm()); err != nil {
			return err
		}
		if err := os.Rename(staged, dst); err != nil {
			return fmt.Errorf("replace %s: %w", p, err)
		}
		undo = append(undo, func() error {
			back := filepath.Join(s.dir, "undo", p)
			if err := writeFile(back, orig, info.Mode().Perm()); err != nil {
				return err
			}
			return os.Rename(back, dst)
		})
	}
	return step()
}

func writeFile(p string, content []byte, perm fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, content, perm)
}

// copyDir copies the regular files of src into dst.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return writeFile(filepath.Join(dst, rel), b, 0o644)
	})
}
