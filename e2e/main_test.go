package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"
)

// harness is what the scenarios of this test binary share: the binaries
// built once and the PostgreSQL server.
type harness struct {
	onceflowBin string
	natsBin     string
	pg          *pgServer
	// scale multiplies every scenario's load (E2E_SCALE).
	scale  float64
	logger *slog.Logger

	sources   []string // what the binaries are built from (listSources)
	trackOnce sync.Once
	trackErr  error
}

// shared is set by TestMain before any test runs and never changed after.
var shared *harness

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		// Every scenario of this package runs the e2e system: it builds no
		// binary, starts no server and runs no test in the -short tier.
		fmt.Println("e2e: skipped under -short: every scenario runs the services, NATS and PostgreSQL as processes (the e2e system)")
		return 0
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("component", "e2e")
	h, cleanup, err := setUp(logger)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: set-up: %v\n", err)
		return 1
	}
	shared = h
	code := m.Run()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cleanup(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if code != 0 {
		return code
	}
	if err := goleak.Find(leakOptions()...); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: leaked goroutines: %v\n", err)
		return 1
	}
	return 0
}

// setUp builds the binaries and starts PostgreSQL. cleanup undoes it.
func setUp(logger *slog.Logger) (_ *harness, cleanup func(context.Context) error, err error) {
	scale, err := readScale()
	if err != nil {
		return nil, nil, err
	}
	binDir, err := os.MkdirTemp("", "onceflow-e2e-bin-")
	if err != nil {
		return nil, nil, fmt.Errorf("binary directory: %w", err)
	}
	h := &harness{
		onceflowBin: filepath.Join(binDir, "onceflow"),
		natsBin:     filepath.Join(binDir, "nats-server"),
		scale:       scale,
		logger:      logger,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a cold build or an image pull included
	defer cancel()

	g, gctx := errgroup.WithContext(ctx)
	onceflowPkg, natsPkg := "github.com/onceflow/onceflow/cmd/onceflow", "github.com/nats-io/nats-server/v2"
	g.Go(func() (err error) {
		h.sources, err = listSources(gctx, onceflowPkg, natsPkg)
		return err
	})
	g.Go(func() error { return build(gctx, h.onceflowBin, onceflowPkg) })
	g.Go(func() error { return build(gctx, h.natsBin, natsPkg) })
	g.Go(func() error {
		var err error
		h.pg, err = startPostgres(gctx, logger)
		return err
	})
	if err := g.Wait(); err != nil {
		var stopErr error
		if h.pg != nil {
			stopErr = h.pg.stop(context.WithoutCancel(ctx))
		}
		return nil, nil, errors.Join(err, stopErr, os.RemoveAll(binDir))
	}
	cleanup = func(ctx context.Context) error {
		return errors.Join(h.pg.stop(ctx), os.RemoveAll(binDir))
	}
	return h, cleanup, nil
}

// build compiles pkg into out, without the race detector whatever the test
// binary was built with: the services run as they do in production, built
// as the Dockerfile builds them (no cgo, -trimpath), which also shares the
// compiled packages with the stand-ins' nats-server and the other tests'.
func build(ctx context.Context, out, pkg string) error {
	if _, err := goCommand(ctx, "build", "-trimpath", "-o", out, pkg); err != nil {
		return fmt.Errorf("build %s: %w", pkg, err)
	}
	return nil
}

// listSources returns the source directories and embedded files of pkgs and
// of what they import, and go.mod and go.sum: what the binaries are built
// from, for trackSources.
func listSources(ctx context.Context, pkgs ...string) ([]string, error) {
	const list = `{{if not .Standard}}{{.Dir}}{{"\n"}}{{range .EmbedFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{end}}`
	out, err := goCommand(ctx, append([]string{"list", "-deps", "-f", list}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("list the sources of %v: %w", pkgs, err)
	}
	gomod, err := goCommand(ctx, "env", "GOMOD")
	if err != nil {
		return nil, fmt.Errorf("find go.mod: %w", err)
	}
	paths := strings.Split(strings.TrimSpace(string(out)), "\n")
	mod := string(bytes.TrimSpace(gomod))
	return append(paths, mod, strings.TrimSuffix(mod, ".mod")+".sum"), nil
}

// trackSources opens what the binaries were built from (listSources), once
// per test binary. `go test` caches a package's result against the files
// its test process opened while tests ran (their size and modification
// time; a directory's, its entries'), and build compiles the binaries in a
// child process it does not see: without this, a change to a service would
// leave this suite's last pass in the cache, and `go test ./...` would
// report it without running the suite. Every scenario calls it (through
// newSystem): opens before the first test starts are not recorded.
func (h *harness) trackSources(t *testing.T) {
	h.trackOnce.Do(func() {
		for _, p := range h.sources {
			f, err := os.Open(p)
			if err == nil {
				err = f.Close()
			}
			if err != nil {
				h.trackErr = fmt.Errorf("track the source %s: %w", p, err)
				return
			}
		}
	})
	require.NoError(t, h.trackErr)
}

// goCommand runs the go command with args, without cgo (see build), and
// returns its standard output.
func goCommand(ctx context.Context, args ...string) ([]byte, error) {
	// go test puts $GOROOT/bin first on the PATH of the test binary.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command is not on PATH: %w", err)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// readScale reads E2E_SCALE: how much larger than the default every
// scenario's load is.
func readScale() (float64, error) {
	v := os.Getenv("E2E_SCALE")
	if v == "" {
		return 1, nil
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || s <= 0 || math.IsInf(s, 0) {
		return 0, fmt.Errorf("E2E_SCALE=%q: want a positive number", v)
	}
	return s, nil
}

// scaled is n times E2E_SCALE, at least 1.
func scaled(n int) int {
	return max(1, int(math.Round(float64(n)*shared.scale)))
}

func leakOptions() []goleak.Option {
	return []goleak.Option{
		// testcontainers keeps a connection to its Ryuk reaper for the life
		// of the process, by design.
		goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
		// toxiproxy v2.5 (the newest the module proxy serves) does not join
		// a link's goroutines when its proxy stops: with a toxic removed
		// while its link was closing, the stub that drained the link's input
		// is gone and the goroutines feeding it stay blocked on a channel
		// send, the stub itself or the link's reader (both seen, the reader
		// in CI). They belong to the test's proxy, not to the services; the
		// proxies themselves are stopped per test.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
	}
}
