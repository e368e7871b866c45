package testenv

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSharedServersNeedRun checks that a test binary whose TestMain does not
// call Run gets no shared server: nothing would stop it, and a local
// PostgreSQL cluster would be left behind by every run.
func TestSharedServersNeedRun(t *testing.T) {
	e := &environment{logger: shared.logger}
	t.Cleanup(func() { require.NoError(t, e.teardown(context.Background())) })

	_, err := e.postgres()
	require.ErrorIs(t, err, errNoRun)
	_, err = e.sharedNATS()
	require.ErrorIs(t, err, errNoRun)
}
