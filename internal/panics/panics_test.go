package panics_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/panics"
)

func TestRecover(t *testing.T) {
	t.Parallel()
	require.NoError(t, panics.Recover(func() error { return nil }))
	require.Equal(t, io.EOF, panics.Recover(func() error { return io.EOF }))
	require.Nil(t, panics.Stack(io.EOF))

	err := panics.Recover(func() error {
		var m map[string]int
		m["x"]++
		return nil
	})
	require.EqualError(t, err, "panic: assignment to entry in nil map")
	require.Contains(t, string(panics.Stack(fmt.Errorf("handler: %w", err))), "panics_test.go")

	err = panics.Recover(func() error { panic(io.ErrUnexpectedEOF) })
	require.True(t, errors.Is(err, io.ErrUnexpectedEOF), "the error it panicked with")
}
