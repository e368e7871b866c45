package localpg

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/freeport"
)

// TestStartMovesOnWhenItsPickedPortIsTaken: a port picked free can be taken
// by another process before the server binds it. Start then picks another
// one; a port the caller chose is not changed behind its back.
func TestStartMovesOnWhenItsPickedPortIsTaken(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	takenPort := taken.Addr().(*net.TCPAddr).Port

	ctx := context.Background()
	t.Run("picked", func(t *testing.T) {
		var ports freeport.Pool
		picks := 0
		c, err := startWith(ctx, Config{}, nil, func() (int, error) {
			picks++
			if picks == 1 {
				return takenPort, nil
			}
			return ports.Take()
		})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })
		require.Equal(t, 2, picks)
		require.NotEqual(t, takenPort, c.port)
	})
	t.Run("chosen", func(t *testing.T) {
		var ports freeport.Pool
		_, err := startWith(ctx, Config{Port: takenPort}, nil, ports.Take)
		require.ErrorIs(t, err, errPortTaken)
	})
}
