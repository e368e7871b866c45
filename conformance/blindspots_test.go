package conformance_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/conformance"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
)

// blindSpots are handlers broken in ways the kit once let pass (issue 48),
// each beside the property that now catches it.
var blindSpots = []breakage{
	{name: "set-based-returns-in-its-loop", batch: func(s *testService) conformance.BatchHandler {
		// The per-event handler's last line pasted into a loop: only
		// the batch's first event takes effect.
		return func(ctx context.Context, tx pgx.Tx, evs []event.Envelope, _ *conformance.Pipeline) error {
			for _, ev := range evs {
				var p event.OrderPlacedV1
				if err := ev.Decode(&p); err != nil {
					return err
				}
				if err := s.record(ctx, tx, ev, p, lockWallet); err != nil {
					return err
				}
				return s.emit(ctx, tx, ev, p) // outbox.Enqueue's error, and the loop's end
			}
			return nil
		}
	}, property: "set-based/batch-of-events-sharing-entities", advice: "every event it is given"},
	{name: "set-based-without-outbox", batch: func(s *testService) conformance.BatchHandler {
		return s.setBased(batchForm{noOutbox: true})
	}, property: "set-based/batch-of-events-sharing-entities", advice: "public.outbox holds 0 rows where a clean run leaves 4"},
	{name: "set-based-row-per-event", batch: func(s *testService) conformance.BatchHandler {
		// UPDATE … FROM unnest(…) with one row per event: PostgreSQL
		// updates a wallet once, whichever of its rows it joins first.
		return s.setBased(batchForm{rowPerEvent: true})
	}, property: "set-based/batch-of-events-sharing-entities", advice: "public.wallets"},
	{name: "set-based-tally-on-its-own-connection", batch: func(s *testService) conformance.BatchHandler {
		return s.setBased(batchForm{tally: true})
	}, property: "writes-only-on-its-transaction", advice: "set-based handler's transaction was rolled back"},
	{name: "batched-staging-never-emptied", handler: func(s *testService) conformance.Handler {
		// Stages its rows in a temporary table emptied only at the
		// commit: the events that share a transaction apply their
		// predecessors' rows again.
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			for _, sql := range []string{
				`CREATE TEMP TABLE IF NOT EXISTS staging (order_id uuid, event_id uuid) ON COMMIT DELETE ROWS`,
				`INSERT INTO staging VALUES ($1, $2)`,
				`INSERT INTO effects (order_id, event_id) SELECT order_id, event_id FROM staging`,
			} {
				if _, err := tx.Exec(ctx, sql, argsOf(sql, p, ev)...); err != nil {
					return fmt.Errorf("stage order %s: %w", p.OrderID, err)
				}
			}
			return s.debitAndEmit(ctx, tx, ev, p)
		})
	}, property: "batched/batch-of-events-sharing-entities", advice: "apply each event once"},
	{name: "emitted-kept-in-memory", handler: func(s *testService) conformance.Handler {
		// Remembers what it emitted: the retry that commits emits nothing.
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			if err := s.record(ctx, tx, ev, p, lockWallet); err != nil {
				return err
			}
			if _, done := s.emitted.LoadOrStore(ev.ID, true); done {
				return nil
			}
			next, err := s.rejection(ev, p)
			if err != nil {
				return err
			}
			return outbox.Enqueue(ctx, tx, next)
		})
	}, property: "error-retried-with-backoff", advice: "no state outside the tx it is given"},
	{name: "copied-envelope-keeps-its-id", handler: func(s *testService) conformance.Handler {
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			if err := s.record(ctx, tx, ev, p, lockWallet); err != nil {
				return err
			}
			next, err := s.rejection(ev, p)
			if err != nil {
				return err
			}
			if err := outbox.Enqueue(ctx, tx, next); err != nil {
				return err
			}
			// A second event made from a copy of the first: same id.
			again := next
			again.Type = event.PaymentDebited
			return outbox.Enqueue(ctx, tx, again)
		})
	}, property: "emits-through-the-outbox", advice: "an id of its own"},
	{name: "key-value-put", handler: func(s *testService) conformance.Handler {
		return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
			if err := s.handle(ctx, tx, ev); err != nil {
				return err
			}
			kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "placed"})
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, ev.ID.String(), []byte(ev.Subject))
			return err
		}
	}, property: "emits-through-the-outbox", advice: "a key-value put is a publish too"},
	{name: "statement-errors-marked-permanent", handler: func(s *testService) conformance.Handler {
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			if err := s.record(ctx, tx, ev, p, lockWallet); err != nil {
				return conformance.Permanent(err) // "the database refused it"
			}
			return s.emit(ctx, tx, ev, p)
		})
	}, property: "statement-error-retried", advice: "mark Permanent only an event no retry can apply"},
	{name: "savepoint-swallows-errors", handler: func(s *testService) conformance.Handler {
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, `INSERT INTO effects (order_id, event_id) VALUES ($1, $2)`, p.OrderID, ev.ID); err != nil {
				_ = sp.Rollback(ctx)
				return nil // "recorded before"
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			return s.debitAndEmit(ctx, tx, ev, p)
		})
	}, property: "statement-error-retried", advice: "acks an event it never applied"},
	{name: "balance-read-without-lock", handler: func(s *testService) conformance.Handler {
		return decoded(func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
			if err := s.record(ctx, tx, ev, p, `SELECT balance_cents FROM wallets WHERE customer_id = $1`); err != nil {
				return err
			}
			return s.emit(ctx, tx, ev, p)
		})
	}, property: "reference/concurrent-events-on-one-entity", advice: "must be locked"},
}

// decoded is a handler that decodes its OrderPlaced and runs f.
func decoded(f func(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error) conformance.Handler {
	return func(ctx context.Context, tx pgx.Tx, ev event.Envelope) error {
		var p event.OrderPlacedV1
		if err := ev.Decode(&p); err != nil {
			return err // wraps event.ErrInvalid: dead-lettered at once
		}
		return f(ctx, tx, ev, p)
	}
}

// argsOf is the arguments of the staging breakage's statements.
func argsOf(sql string, p event.OrderPlacedV1, ev event.Envelope) []any {
	if sql == `INSERT INTO staging VALUES ($1, $2)` {
		return []any{p.OrderID, ev.ID}
	}
	return nil
}

// debitAndEmit debits the order's wallet and emits its PaymentRejected:
// the correct handler's effect, but for the order's row.
func (s *testService) debitAndEmit(ctx context.Context, tx pgx.Tx, ev event.Envelope, p event.OrderPlacedV1) error {
	var balance int64
	if err := tx.QueryRow(ctx, lockWallet, p.CustomerID).Scan(&balance); err != nil {
		return fmt.Errorf("read wallet %s: %w", p.CustomerID, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE wallets SET balance_cents = $2 WHERE customer_id = $1`, p.CustomerID, balance-p.TotalCents); err != nil {
		return fmt.Errorf("debit wallet %s: %w", p.CustomerID, err)
	}
	return s.emit(ctx, tx, ev, p)
}
