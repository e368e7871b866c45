package apptest

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/postgres"
)

// PerEvent configures a service to run every event of a batch under its own
// handler instead of a subscription's set-based batch handler.
func PerEvent(cfg *app.Config) { cfg.ConsumerSetBased = false }

// Unbatched configures a service to run every message in a transaction of
// its own.
func Unbatched(cfg *app.Config) { cfg.ConsumerBatched = new(false) }

// mode is a consumer mode a test runs in.
type mode struct {
	name      string
	configure func(*app.Config)
}

// EachMode runs f as two parallel subtests of name: with the set-based batch
// handlers (the default), and per event, the reference the batch handlers
// must equal.
func EachMode(t *testing.T, name string, f func(t *testing.T, mode func(*app.Config))) {
	t.Helper()
	eachOf(t, name, []mode{{"set-based", func(*app.Config) {}}, {"per-event", PerEvent}}, f)
}

// EachConsumerMode runs f as three parallel subtests of name, one per way
// the inbox can process a message: batched with the set-based batch handlers
// (the default), batched per event, and unbatched, a transaction per
// message. It is for what the inbox cannot decide for the handlers: a
// business rule that must hold however the events are grouped.
func EachConsumerMode(t *testing.T, name string, f func(t *testing.T, mode func(*app.Config))) {
	t.Helper()
	eachOf(t, name, []mode{{"set-based", func(*app.Config) {}}, {"per-event", PerEvent}, {"unbatched", Unbatched}}, f)
}

func eachOf(t *testing.T, name string, modes []mode, f func(t *testing.T, mode func(*app.Config))) {
	t.Helper()
	for _, m := range modes {
		t.Run(strings.TrimPrefix(name+"/"+m.name, "/"), func(t *testing.T) {
			t.Parallel()
			f(t, m.configure)
		})
	}
}

// InTx runs f in a transaction and commits it.
func InTx(t *testing.T, pool *pgxpool.Pool, f func(context.Context, pgx.Tx) error) {
	t.Helper()
	require.NoError(t, tryTx(t.Context(), pool, f))
}

// Rows returns every row of query, for comparing two databases.
func Rows(t *testing.T, pool *pgxpool.Pool, query string) [][]any {
	t.Helper()
	rows, err := pool.Query(t.Context(), query)
	require.NoError(t, err)
	defer rows.Close()
	var all [][]any
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		all = append(all, vals)
	}
	require.NoError(t, rows.Err())
	return all
}

// RandomBatches splits evs, in order, into batches of 1 to 40 events.
func RandomBatches(rng *rand.Rand, evs []event.Envelope) [][]event.Envelope {
	var batches [][]event.Envelope
	for rest := evs; len(rest) > 0; {
		batch := rest[:1+rng.IntN(min(len(rest), 40))]
		rest = rest[len(batch):]
		batches = append(batches, batch)
	}
	return batches
}

// ApplyBothForms applies the events of batches one by one with perEvent on
// ref, one transaction each, and batch by batch on set, as the inbox does:
// with batch in one transaction, and when it fails, rolled back and applied
// again with perEvent in a new one. The caller then compares the databases.
// It returns how many batches fell back to perEvent.
func ApplyBothForms(t *testing.T, ref, set *pgxpool.Pool, batches [][]event.Envelope, perEvent inbox.Handler, batch inbox.BatchHandler) (fellBack int) {
	t.Helper()
	for _, evs := range batches {
		for _, ev := range evs {
			InTx(t, ref, func(ctx context.Context, tx pgx.Tx) error { return perEvent(ctx, tx, ev) })
		}
		if err := tryTx(t.Context(), set, func(ctx context.Context, tx pgx.Tx) error { return ApplyBatch(ctx, tx, batch, evs) }); err != nil {
			fellBack++
			InTx(t, set, func(ctx context.Context, tx pgx.Tx) error {
				for _, ev := range evs {
					if err := perEvent(ctx, tx, ev); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	return fellBack
}

// tryTx runs f in a transaction and commits it, or rolls it back and
// returns the error.
func tryTx(ctx context.Context, pool *pgxpool.Pool, f func(context.Context, pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return f(ctx, tx) })
}

// ApplyBatch runs batch for evs on tx and sends the writes it queued, as the
// inbox does with its COMMIT.
func ApplyBatch(ctx context.Context, tx pgx.Tx, batch inbox.BatchHandler, evs []event.Envelope) error {
	var writes postgres.Pipeline
	if err := batch(ctx, tx, evs, &writes); err != nil {
		return err
	}
	return writes.Send(ctx, tx)
}

// RequireSameRows requires every query to return the same rows, and some,
// on ref and on set.
func RequireSameRows(t *testing.T, ref, set *pgxpool.Pool, queries ...string) {
	t.Helper()
	for _, q := range queries {
		want := Rows(t, ref, q)
		require.NotEmpty(t, want, q)
		require.Equal(t, want, Rows(t, set, q), q)
	}
}

// Repeating counts the batches that carry an event about the subject (the
// order) of an event in an earlier batch.
func Repeating(batches [][]event.Envelope) int {
	var n int
	seen := make(map[string]bool)
	for _, evs := range batches {
		repeats := false
		for _, ev := range evs {
			repeats = repeats || seen[ev.Subject]
		}
		for _, ev := range evs {
			seen[ev.Subject] = true
		}
		if repeats {
			n++
		}
	}
	return n
}
