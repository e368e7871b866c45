package conformance_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAnotherModuleUsesTheKit builds, in a temporary directory, a module
// of its own (example.com/shop, testdata/othermodule) that requires
// onceflow through a replace directive and runs the kit against its
// handlers (a set-based one too), written with the kit's public types
// only: its test passes, each property by name.
func TestAnotherModuleUsesTheKit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds and tests a module of its own (minutes of builds)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := filepath.Join("testdata", "othermodule")
	for from, to := range map[string]string{
		"go.mod.txt": "go.mod", "shop.go.txt": "shop.go", "shop_test.go.txt": "shop_test.go",
		"migrations/00001_stamps.sql": "migrations/00001_stamps.sql",
	} {
		b, err := os.ReadFile(filepath.Join(src, from))
		if err != nil {
			t.Fatal(err)
		}
		b = []byte(strings.ReplaceAll(string(b), "REPO", root))
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, to)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// onceflow's go.sum holds every module the kit needs, all in the module
	// cache: the outside module resolves them offline.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	// -race, as make test: the kit's packages make test compiled serve here
	// too (without it a fresh machine compiles them all a second time).
	cmd := exec.CommandContext(t.Context(), "go", "test", "-race", "-count=1", "-v", "-run", "TestConformance", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test in a module outside onceflow's: %v\n%s", err, out)
	}
	for _, want := range []string{
		"--- PASS: TestConformance/shop-orders/writes-only-on-its-transaction",
		"--- PASS: TestConformance/shop-orders/accepts-events-only-from-their-owner",
		"--- PASS: TestConformance/shop-orders/reference/duplicate-concurrent",
		"--- PASS: TestConformance/shop-orders/batched/permanent-error-to-dlq",
		"--- PASS: TestConformance/shop-orders/set-based/batch-of-events-sharing-entities",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the outside module's test did not report %q:\n%s", want, out)
		}
	}
}
