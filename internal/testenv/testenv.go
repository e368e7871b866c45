package testenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/freeport"
)

// shared is the environment of this test binary: the servers its tests share,
// started on first use and stopped by Run.
var shared = &environment{
	logger: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "testenv"),
}

// environment holds what outlives a single test.
type environment struct {
	logger *slog.Logger

	// running is set by Run: only then are the shared servers started,
	// since only Run stops them.
	running atomic.Bool

	containersOnce sync.Once
	containers     ContainerChoice // whether PostgreSQL and NATS run as containers
	containersErr  error

	pgOnce sync.Once
	pg     *pgServer
	pgErr  error

	natsOnce sync.Once
	natsURL  string // of the shared server; empty means embedded per test
	natsErr  error
	// natsHeld serialises the tests on a shared NATS server, whose streams
	// have fixed names.
	natsHeld sync.Mutex
	ports    freeport.Pool // handed out by FreePorts

	mu         sync.Mutex
	teardowns  []func(context.Context) error // run in reverse order
	usedDocker bool
}

// settings is what the environment reads from environment variables.
type settings struct {
	databaseURL string // TEST_DATABASE_URL
	natsURL     string // TEST_NATS_URL
}

func readSettings() settings {
	return settings{
		databaseURL: os.Getenv("TEST_DATABASE_URL"),
		natsURL:     os.Getenv("TEST_NATS_URL"),
	}
}

// Run runs the tests, stops the shared servers, and then, if the tests
// passed, fails when goroutines are left over. It returns the exit code.
func Run(m *testing.M) int {
	shared.running.Store(true)
	code := m.Run()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := shared.teardown(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if code != 0 {
		return code
	}
	if err := goleak.Find(shared.leakOptions()...); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: leaked goroutines: %v\n", err)
		return 1
	}
	return 0
}

// errNoRun is the error of a test that asks for a shared server in a test
// binary whose TestMain does not call Run.
var errNoRun = errors.New("the package's TestMain must call testenv.Run, which stops the shared servers " +
	"(func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }); without it every run would leave them behind")

// onTeardown registers f to run when the tests are done, before the ones
// registered earlier.
func (e *environment) onTeardown(f func(context.Context) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.teardowns = append(e.teardowns, f)
}

func (e *environment) teardown(ctx context.Context) error {
	e.mu.Lock()
	teardowns := e.teardowns
	e.teardowns = nil
	e.mu.Unlock()
	var errs []error
	for _, f := range slices.Backward(teardowns) {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

func (e *environment) leakOptions() []goleak.Option {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.usedDocker {
		return nil
	}
	// testcontainers keeps a connection to its Ryuk reaper for the life of
	// the process, by design: Ryuk removes the containers when it drops.
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
	}
}

// useContainers reports whether the shared servers run as containers, and
// why. It decides once per binary, for both servers, so that a machine
// holding only one of the images runs both locally.
func (e *environment) useContainers() (ContainerChoice, error) {
	e.containersOnce.Do(func() {
		e.containers, e.containersErr = ChooseContainers(context.Background(), PostgresImage(), NATSImage())
	})
	return e.containers, e.containersErr
}

func (e *environment) markDockerUsed() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.usedDocker = true
}
