package bench

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/postgres"
)

// The inbox's statements (internal/inbox's ClaimEvent and ClaimEvents; the
// pipelined modes use plain inserts, the cheapest claim there is) and
// the business write the benchmarks' handlers do: a wallet debit, per event
// or set-based (payment's DebitWallet and DebitWallets).
const (
	claimSQL = `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
VALUES ($1, $2, $3, $4, $5, uuid7_time($2))
ON CONFLICT DO NOTHING
RETURNING event_id`

	// A claim without ON CONFLICT, for the pipelined modes.
	claimNewSQL = `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
VALUES ($1, $2, $3, $4, $5, uuid7_time($2))`

	claimBatchSQL = `INSERT INTO processed_events (consumer, event_id, event_type, event_time, stream_seq, minted_at)
SELECT $1::text, e.event_id, e.event_type, e.event_time, e.stream_seq, uuid7_time(e.event_id)
FROM (
    SELECT
        unnest($2::uuid[])        AS event_id,
        unnest($3::text[])        AS event_type,
        unnest($4::timestamptz[]) AS event_time,
        unnest($5::bigint[])      AS stream_seq
) AS e
ORDER BY e.event_id`

	debitSQL = `UPDATE wallets
SET balance_cents = balance_cents - $2, updated_at = now()
WHERE customer_id = $1 AND balance_cents >= $2`

	// The debit as an :exec of sqlc's, queued in the pipelined mode. It
	// cannot check that a wallet was debited; TestConsumerWorkloadsDebitEveryEventOnce
	// checks the sum.
	debitExecSQL = "-- name: DebitWallet :exec\n" + debitSQL

	// The set-based debit runs on one connection here. Its plan (a hash
	// join over a scan of the thousand wallets) locks rows in the order it
	// finds them, so concurrent batches lock their wallets in key order
	// first, as payment's do (LockWallets).
	debitSetSQL = `UPDATE wallets
SET balance_cents = wallets.balance_cents - d.amount, updated_at = now()
FROM (SELECT unnest($1::text[]) AS customer_id, unnest($2::bigint[]) AS amount) AS d
WHERE wallets.customer_id = d.customer_id AND wallets.balance_cents >= d.amount`
)

const benchConsumer = "bench"

// claimOne is the inbox's claim of one event.
func claimOne(ctx context.Context, tx pgx.Tx, ev event.Envelope, seq int64) error {
	var id uuid.UUID
	return tx.QueryRow(ctx, claimSQL, benchConsumer, ev.ID, string(ev.Type), ev.Time, seq).Scan(&id)
}

// claimBatch is the inbox's claim of a batch of first deliveries, in event
// id order.
func claimBatch(ctx context.Context, tx postgres.DBTX, evs []event.Envelope) error {
	tag, err := tx.Exec(ctx, claimBatchSQL, claimBatchArgs(evs)...)
	if err != nil {
		return err
	}
	return claimedAll(tag.RowsAffected(), evs)
}

// claimBatchArgs are claimBatchSQL's arguments for evs.
func claimBatchArgs(evs []event.Envelope) []any {
	byID := slices.SortedFunc(slices.Values(evs), func(a, b event.Envelope) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	ids, types, times, seqs := make([]uuid.UUID, len(byID)), make([]string, len(byID)), make([]time.Time, len(byID)), make([]int64, len(byID))
	for i, ev := range byID {
		ids[i], types[i], times[i], seqs[i] = ev.ID, string(ev.Type), ev.Time, int64(i)
	}
	return []any{benchConsumer, ids, types, times, seqs}
}

// claimedAll checks that a batch's claim inserted a row per event.
func claimedAll(n int64, evs []event.Envelope) error {
	if n != int64(len(evs)) {
		return fmt.Errorf("claimed %d of %d", n, len(evs))
	}
	return nil
}

// debitOne is the per-event business write.
func debitOne(ctx context.Context, tx pgx.Tx, customer string, amount int64) error {
	tag, err := tx.Exec(ctx, debitSQL, customer, amount)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("wallet %s not debited", customer)
	}
	return err
}

// debitSet is the set-based business write: one statement, amounts summed
// per wallet, wallets in key order.
func debitSet(ctx context.Context, tx pgx.Tx, customers []string, amounts []int64) error {
	sum := make(map[string]int64, len(customers))
	for i, c := range customers {
		sum[c] += amounts[i]
	}
	ids := slices.Sorted(maps.Keys(sum))
	net := make([]int64, len(ids))
	for i, id := range ids {
		net[i] = sum[id]
	}
	tag, err := tx.Exec(ctx, debitSetSQL, ids, net)
	if err == nil && tag.RowsAffected() != int64(len(ids)) {
		err = fmt.Errorf("%d of %d wallets debited", tag.RowsAffected(), len(ids))
	}
	return err
}

// BenchmarkDBLimit is the database's limit: the inbox's claim and a wallet
// debit issued straight from Go, without NATS, one event per transaction on
// 1 and 4 connections (a round trip per statement, tx1, or all in one as
// the inbox sends them, tx1pipelined), and batchSize events per
// transaction: one claim
// statement and then a debit per event, in a round trip each (batch) or
// with BEGIN and COMMIT in one round trip as the batched inbox sends them
// (pipelined), a debit per event each under a savepoint, or one set-based
// debit.
func BenchmarkDBLimit(b *testing.B) {
	for _, pg := range pgTargets(b) {
		for _, conns := range []int{1, 4} {
			b.Run(fmt.Sprintf("pg=%s/mode=tx1/conns=%d", pg.name, conns), func(b *testing.B) {
				pool := pg.walletsDB(b)
				ds := orderEvents(b, b.N)
				drive(b, conns, 1, ds, func(ctx context.Context, chunk []debit) error {
					d := chunk[0]
					return inTx(ctx, pool, func(tx pgx.Tx) error {
						if err := claimOne(ctx, tx, d.ev, 1); err != nil {
							return err
						}
						return debitOne(ctx, tx, d.customer, d.amount)
					})
				})
			})
			b.Run(fmt.Sprintf("pg=%s/mode=tx1pipelined/conns=%d", pg.name, conns), func(b *testing.B) {
				pool := pg.walletsDB(b)
				ds := orderEvents(b, b.N)
				drive(b, conns, 1, ds, func(ctx context.Context, chunk []debit) error {
					// BEGIN, the claim, the debit and COMMIT in one round
					// trip, as the inbox sends a first delivery whose
					// handler only writes.
					d := chunk[0]
					begin := postgres.BeginWith(pool)
					defer begin.End(ctx)
					_, _ = begin.Ahead().Exec(ctx, claimNewSQL, benchConsumer, d.ev.ID, string(d.ev.Type), d.ev.Time, int64(1)) // queued
					var debit postgres.Pipeline
					_, _ = debit.Exec(ctx, debitSQL, d.customer, d.amount) // queued
					var debited int64
					debit.CountInto(&debited)
					if err := begin.Commit(ctx, &debit); err != nil {
						return err
					}
					if debited != 1 {
						return fmt.Errorf("wallet %s not debited", d.customer)
					}
					return nil
				})
			})
		}
		b.Run(fmt.Sprintf("pg=%s/mode=batch/conns=1", pg.name), func(b *testing.B) {
			pool := pg.walletsDB(b)
			ds := orderEvents(b, b.N)
			drive(b, 1, batchSize, ds, func(ctx context.Context, chunk []debit) error {
				return inTx(ctx, pool, func(tx pgx.Tx) error {
					if err := claimBatch(ctx, tx, envelopes(chunk)); err != nil {
						return err
					}
					for _, d := range chunk {
						if err := debitOne(ctx, tx, d.customer, d.amount); err != nil {
							return err
						}
					}
					return nil
				})
			})
		})
		b.Run(fmt.Sprintf("pg=%s/mode=pipelined/conns=1", pg.name), func(b *testing.B) {
			pool := pg.walletsDB(b)
			ds := orderEvents(b, b.N)
			drive(b, 1, batchSize, ds, func(ctx context.Context, chunk []debit) error {
				// BEGIN, the claim, the debits and COMMIT in one round
				// trip, as the inbox sends a batch of first deliveries
				// whose handlers only write.
				begin := postgres.BeginWith(pool)
				defer begin.End(ctx)
				evs := envelopes(chunk)
				ahead := begin.Ahead()
				_, _ = ahead.Exec(ctx, claimBatchSQL, claimBatchArgs(evs)...) // queued
				var claimed int64
				ahead.CountInto(&claimed)
				var debits postgres.Pipeline
				for _, d := range chunk {
					_, _ = debits.Exec(ctx, debitExecSQL, d.customer, d.amount) // queued
				}
				if err := begin.Commit(ctx, &debits); err != nil {
					return err
				}
				return claimedAll(claimed, evs)
			})
		})
		b.Run(fmt.Sprintf("pg=%s/mode=savepoint/conns=1", pg.name), func(b *testing.B) {
			pool := pg.walletsDB(b)
			ds := orderEvents(b, b.N)
			drive(b, 1, batchSize, ds, func(ctx context.Context, chunk []debit) error {
				return inTx(ctx, pool, func(tx pgx.Tx) error {
					if err := claimBatch(ctx, tx, envelopes(chunk)); err != nil {
						return err
					}
					for _, d := range chunk {
						sp, err := tx.Begin(ctx)
						if err != nil {
							return err
						}
						if err := debitOne(ctx, sp, d.customer, d.amount); err != nil {
							return err
						}
						if err := sp.Commit(ctx); err != nil {
							return err
						}
					}
					return nil
				})
			})
		})
		b.Run(fmt.Sprintf("pg=%s/mode=setbased/conns=1", pg.name), func(b *testing.B) {
			pool := pg.walletsDB(b)
			ds := orderEvents(b, b.N)
			drive(b, 1, batchSize, ds, func(ctx context.Context, chunk []debit) error {
				customers, amounts := make([]string, len(chunk)), make([]int64, len(chunk))
				for i, d := range chunk {
					customers[i], amounts[i] = d.customer, d.amount
				}
				return inTx(ctx, pool, func(tx pgx.Tx) error {
					if err := claimBatch(ctx, tx, envelopes(chunk)); err != nil {
						return err
					}
					return debitSet(ctx, tx, customers, amounts)
				})
			})
		})
	}
}
