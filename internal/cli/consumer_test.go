package cli

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestConsumerPauseAndResume pauses a durable of the saga as the operator
// and resumes it: the server reports it paused, until the time asked, and
// then not; a name outside the saga is refused.
func TestConsumerPauseAndResume(t *testing.T) {
	nt := testenv.NewNATS(t)
	js := nt.JetStream(t)
	ctx := t.Context()
	require.NoError(t, streams.Provision(ctx, js, streams.Saga(streams.Config{Storage: jetstream.MemoryStorage})))
	t.Setenv("NATS_URL", nt.URL)
	t.Setenv("NATS_CREDS", nt.Client(streams.Operator).Creds)
	paused := func() (bool, time.Time) {
		c, err := js.Consumer(ctx, streams.Payments, streams.InventoryPayments)
		require.NoError(t, err)
		info, err := c.Info(ctx)
		require.NoError(t, err)
		var until time.Time
		if info.Config.PauseUntil != nil {
			until = *info.Config.PauseUntil
		}
		return info.Paused, until
	}

	asked := time.Now()
	stdout, _, err := run(t, "consumer", "pause", streams.InventoryPayments, "--for", "10m")
	require.NoError(t, err)
	require.Contains(t, stdout, "inventory-payments on PAYMENTS paused until ")
	ok, until := paused()
	require.True(t, ok)
	require.WithinDuration(t, asked.Add(10*time.Minute), until, time.Minute)

	stdout, _, err = run(t, "consumer", "resume", streams.InventoryPayments)
	require.NoError(t, err)
	require.Contains(t, stdout, "inventory-payments on PAYMENTS resumed")
	ok, _ = paused()
	require.False(t, ok)

	_, _, err = run(t, "consumer", "pause", "nobody-orders")
	require.ErrorContains(t, err, `"nobody-orders" is not a durable of the saga`)
	// A pause has a bound: one that outlasts a day is one forgotten.
	for _, d := range []string{"25h", "8760h", "0s", "-1m"} {
		_, _, err = run(t, "consumer", "pause", streams.InventoryPayments, "--for", d)
		require.ErrorContains(t, err, "--for must be more than 0 and at most 24h0m0s", d)
		ok, _ = paused()
		require.False(t, ok, "--for %s paused nothing", d)
	}
	// Help after the verb is help, not a durable named "-h"; flags may
	// come before the durable.
	stdout, _, err = run(t, "consumer", "pause", "-h")
	require.NoError(t, err)
	require.Contains(t, stdout, "-for")
	_, _, err = run(t, "consumer", "pause")
	require.ErrorContains(t, err, "want the durable to pause")
	_, _, err = run(t, "consumer", "pause", "--for", "0s", streams.InventoryPayments)
	require.ErrorContains(t, err, "--for must be more than 0")
	_, _, err = run(t, "consumer", "stop", streams.InventoryPayments)
	require.ErrorContains(t, err, "want 'onceflow consumer pause DURABLE")
}
