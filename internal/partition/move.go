package partition

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/internal/partition/internal/dbsqlc"
)

const (
	// moveBatch is how many rows one step of a move takes out of a DEFAULT
	// partition: a transaction of some tens of milliseconds that holds no
	// lock a writer waits behind.
	moveBatch = 5000
	// smallDefault is the size of a DEFAULT partition (256kB: some 2,000
	// rows of the inbox) whose rows partition_create moves and whose ATTACH
	// scans it under its lock, in a few milliseconds: a new database's first
	// writes, an event from a clock far ahead.
	smallDefault = 256 << 10
)

// prepare readies the partition r of t when the DEFAULT partition is larger
// than smallDefault (rows, or the dead tuples of rows moved out of it), so that create attaches it holding its locks for a catalog change
// only (see the package doc, and 00017): it makes the partition's table
// unattached, makes DEFAULT refuse rows of the range, moves the range's rows
// out of DEFAULT in batches and validates DEFAULT's refusal. The outbox's
// unsent rows stay where the relay sees them; when at most a batch of them
// is left, create moves them under the DEFAULT partition's lock.
func (m *Maintainer) prepare(ctx context.Context, t Table, r span) error {
	large, err := m.queries.DefaultLarger(ctx, m.pool, dbsqlc.DefaultLargerParams{Parent: t.Name, Bytes: smallDefault})
	if err != nil {
		return fmt.Errorf("look at the DEFAULT partition of %s: %w", t.Name, err)
	}
	if !large {
		return nil
	}
	begun, err := m.step(ctx, t.Name, "move_begin", func(lockTimeout string) (bool, error) {
		return m.queries.MoveBegin(ctx, m.pool, dbsqlc.MoveBeginParams{
			Parent: t.Name, Key: t.Key, Lo: r.lo, Hi: r.hi, LockTimeout: lockTimeout,
		})
	})
	if err != nil || !begun {
		return err
	}
	left, unmoved, err := m.moveRows(ctx, t, r)
	m.cfg.Observer.Unmoved(t.Name, unmoved)
	if err != nil || left > 0 {
		return err
	}
	_, err = m.step(ctx, t.Name, "move_validate", func(lockTimeout string) (bool, error) {
		err := m.queries.MoveValidate(ctx, m.pool, dbsqlc.MoveValidateParams{Parent: t.Name, Lo: r.lo, LockTimeout: lockTimeout})
		return err == nil, err
	})
	return err
}

// moveRows moves the rows of r out of the DEFAULT partition of t, a batch a
// transaction, and returns how many are left: none, or in the outbox at
// most a batch of unsent rows, which create moves. It waits for the relay
// to send more, growing pauses Config.Attempts times, before it gives up
// for this round, and then returns too the rows it could not move (up to
// a batch and one).
func (m *Maintainer) moveRows(ctx context.Context, t Table, r span) (left, unmoved int, err error) {
	waited := 0
	for {
		start := time.Now()
		res, err := m.queries.MoveBatch(ctx, m.pool, dbsqlc.MoveBatchParams{
			Parent: t.Name, Key: t.Key, Lo: r.lo, Hi: r.hi, N: moveBatch, SentOnly: t.SentOnly,
		})
		m.cfg.Observer.Step(t.Name, "move", time.Since(start), err)
		switch {
		case err != nil:
			return 0, 0, fmt.Errorf("move rows into %s from %s: %w", t.Name, r.lo.Format(time.RFC3339), err)
		case res.LeftBehind == 0:
			return 0, 0, nil
		case res.Moved > 0:
			waited = 0
			continue
		case res.LeftBehind <= moveBatch:
			return int(res.LeftBehind), 0, nil
		case waited == m.cfg.Attempts:
			return 0, int(res.LeftBehind), fmt.Errorf("rows of %s from %s wait unsent in its DEFAULT partition (at least %d)",
				t.Name, r.lo.Format(time.RFC3339), res.LeftBehind)
		}
		waited++
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(time.Duration(waited) * m.cfg.LockTimeout):
		}
	}
}

// cleanDefault deletes the rows of the DEFAULT partition of t below its
// floor, which no partition will ever take, a batch a transaction, and
// returns how many it deleted.
func (m *Maintainer) cleanDefault(ctx context.Context, t Table) (int, error) {
	used, err := m.queries.DefaultLarger(ctx, m.pool, dbsqlc.DefaultLargerParams{Parent: t.Name, Bytes: 0})
	if err != nil || !used {
		return 0, err
	}
	var total int
	for {
		start := time.Now()
		var n int32
		var err error
		if t.SentOnly {
			n, err = m.queries.CleanSentDefault(ctx, m.pool, dbsqlc.CleanSentDefaultParams{
				Parent: t.Name, Key: t.Key, N: moveBatch,
				Retention: pgtype.Interval{Microseconds: t.Retention.Microseconds(), Valid: true},
			})
		} else {
			n, err = m.queries.CleanDefault(ctx, m.pool, dbsqlc.CleanDefaultParams{Parent: t.Name, Key: t.Key, N: moveBatch})
		}
		m.cfg.Observer.Step(t.Name, "clean_default", time.Since(start), err)
		if err != nil {
			return total, fmt.Errorf("clean the DEFAULT partition of %s: %w", t.Name, err)
		}
		total += int(n)
		if n < moveBatch {
			return total, nil
		}
	}
}
