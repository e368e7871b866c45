package testenv

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
)

// ForExample returns a testing.TB for an Example function, which is given
// none, so that a runnable example gets its servers from NewDatabase and
// NewNATS as a test does. done runs the cleanups registered on it, in
// reverse order, as a test's end would; call it before the example returns.
// A Fatalf or Errorf panics, which fails the example.
func ForExample(name string) (tb testing.TB, done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	e := &exampleTB{name: name, ctx: ctx}
	return e, func() {
		cancel() // as t.Context is canceled before the cleanups run
		e.mu.Lock()
		cleanups := e.cleanups
		e.cleanups = nil
		e.mu.Unlock()
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}
}

// exampleTB implements the part of testing.TB that testenv's helpers call.
type exampleTB struct {
	// testing.TB is embedded for its unexported method alone; it is nil, so
	// a method not implemented below panics, loudly.
	testing.TB
	name string
	ctx  context.Context

	mu       sync.Mutex
	cleanups []func()
}

func (e *exampleTB) Helper()                  {}
func (e *exampleTB) Name() string             { return e.name }
func (e *exampleTB) Context() context.Context { return e.ctx }

func (e *exampleTB) Cleanup(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

func (e *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		e.Fatalf("testenv: %v", err)
	}
	e.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (e *exampleTB) Errorf(format string, args ...any) { e.Fatalf(format, args...) }

func (e *exampleTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("%s: %s", e.name, fmt.Sprintf(format, args...)))
}
