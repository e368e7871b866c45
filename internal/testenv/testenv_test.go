package testenv_test

import (
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func platformSchema(t *testing.T) postgres.Schema {
	t.Helper()
	schema, err := postgres.ServiceSchema("")
	require.NoError(t, err)
	return schema
}

func TestNewDatabaseGivesDistinctMigratedDatabases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := platformSchema(t)

	a := testenv.NewDatabase(t, schema)
	b := testenv.NewDatabase(t, schema)
	require.NotEqual(t, a.Name, b.Name)

	for _, db := range []*testenv.Database{a, b} {
		var current string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT current_database()").Scan(&current))
		require.Equal(t, db.Name, current)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM processed_events").Scan(&n))
		require.Zero(t, n)
	}

	// A write to one is not seen in the other.
	_, err := a.Pool.Exec(ctx, `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
		VALUES ('c', gen_random_uuid(), 't', now(), 1, now())`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, "SELECT count(*) FROM processed_events").Scan(&n))
	require.Zero(t, n)
}

func TestTerminateBackends(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.NewDatabase(t, platformSchema(t))

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, db.TerminateBackends(ctx))
	require.Error(t, conn.Ping(ctx), "the held connection is broken")

	// The pool replaces broken connections.
	require.NoError(t, db.Pool.Ping(ctx))
}

func TestNewNATS(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	n := testenv.NewNATS(t)
	js := n.JetStream(t)

	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TEST", Subjects: []string{"test.>"}})
	require.NoError(t, err)
	ack, err := js.Publish(ctx, "test.one", []byte("hello"), jetstream.WithMsgID("one"))
	require.NoError(t, err)
	require.Equal(t, "TEST", ack.Stream)
	require.EqualValues(t, 1, ack.Sequence)
}

func TestNATSRestartKeepsStreams(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	n := testenv.NewNATS(t)
	if !n.Embedded() {
		t.Skip("the NATS server is shared; Restart needs an embedded one")
	}
	reconnected := make(chan struct{}, 1)
	js, err := jetstream.New(n.Conn(t, nats.ReconnectHandler(func(*nats.Conn) {
		select {
		case reconnected <- struct{}{}:
		default:
		}
	})))
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "TEST", Subjects: []string{"test.>"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "test.one", []byte("hello"))
	require.NoError(t, err)

	n.Restart(t)

	// The old connection reconnects by itself. A request sent before the
	// client noticed that its connection died would be lost with it (and
	// time out), so the test waits for the reconnection first.
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not reconnect within 10s")
	}
	stream, err := js.Stream(ctx, "TEST")
	require.NoError(t, err)
	require.EqualValues(t, 1, stream.CachedInfo().State.Msgs)
}

func TestChooseContainers(t *testing.T) {
	absent := "onceflow-testenv-absent:0.0.0"
	tests := []struct {
		mode    string
		wantErr bool
	}{
		{mode: "off"},
		{mode: "0"},
		{mode: "auto"},
		{mode: ""},
		{mode: "sometimes", wantErr: true},
	}
	for _, tt := range tests {
		t.Run("TEST_CONTAINERS="+tt.mode, func(t *testing.T) {
			t.Setenv("TEST_CONTAINERS", tt.mode)
			choice, err := testenv.ChooseContainers(t.Context(), absent)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			// An image nobody has is never used in auto: no pull is tried.
			require.False(t, choice.Use, choice.Reason)
			require.NotEmpty(t, choice.Reason)
		})
	}
}
