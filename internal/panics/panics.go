// Package panics turns a panic in code the platform calls (a handler, a
// decoder, a mail sender, the relay's own flush) into an error: the failure
// of the one message or batch it was working on, retried and reported like
// any other, while the process carries on.
package panics

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// Error is a recovered panic.
type Error struct {
	Value any    // what the code panicked with
	Stack []byte // where it panicked, for the log
}

func (e *Error) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Unwrap lets errors.Is see an error the code panicked with.
func (e *Error) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Recover calls f and returns its error, or an *Error if it panicked.
func Recover(f func() error) (err error) {
	// The one deferred closure that sets a result: recover works only so.
	defer func() {
		if v := recover(); v != nil {
			err = &Error{Value: v, Stack: debug.Stack()}
		}
	}()
	return f()
}

// Stack is the stack of the panic err is or wraps, or nil when err is not
// a recovered panic.
func Stack(err error) []byte {
	if p, ok := errors.AsType[*Error](err); ok {
		return p.Stack
	}
	return nil
}
