package partition

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/partition/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

const (
	// DefaultAhead is how far past the clock (and Accepts) partitions
	// reach, unless that is more than MaxPartitionsAhead intervals: long
	// enough for a maintenance kept from its locks for hours (a long reader
	// of the table holds its DEFAULT partition, which each create locks) to
	// leave no row to the DEFAULT partition.
	DefaultAhead = 6 * time.Hour
	// MaxPartitionsAhead bounds the partitions made ahead: every partition
	// of the outbox costs the relay's claim, which reads them all, a few
	// index probes (some 30µs a partition, measured on an empty outbox).
	MaxPartitionsAhead = 12

	// Writers that come while a step waits for its lock queue behind it:
	// they wait as long as the step waits, and then as long as it holds
	// the lock. 20ms of waiting and a few of holding keep them well under
	// 100ms (bench/soak.sh, with 50ms: writers waited up to 66ms).
	defaultLockTimeout = 20 * time.Millisecond
	defaultAttempts    = 20
	// The maintenance runs at least this often, and at most once a second.
	maxEvery = time.Minute
)

// Table is a partitioned table that a Maintainer keeps.
type Table struct {
	// Name is the partitioned table, Key its partition key column.
	Name, Key string
	// Interval is the width of a partition; partitions are aligned on
	// multiples of it, as time.Truncate aligns (but the first after a
	// migration, which starts where the migration's partition ends).
	Interval time.Duration
	// Accepts is how far past the clock rows may be written (the inbox's
	// allowed skew; none in the outbox, written at the time of its
	// transaction). Partitions are made at least two intervals further
	// ahead, so that a new partition's range is one where nobody writes
	// yet, and attaching it keeps no writer waiting.
	Accepts time.Duration
	// Ahead is how far past Accepts partitions reach (default
	// DefaultAhead, at most MaxPartitionsAhead intervals; at least two
	// intervals): how long a maintenance may be kept from its locks before
	// rows go to the DEFAULT partition.
	Ahead time.Duration
	// Retention: a partition whose upper bound is older than it is dropped.
	Retention time.Duration
	// SentOnly keeps an outbox partition while it holds a row unsent or sent
	// less than Retention ago, and prunes the relay's positions older than
	// Retention.
	SentOnly bool
}

func (t Table) validate() error {
	if t.Name == "" || t.Key == "" || t.Interval < time.Second || t.Retention <= 0 || t.Accepts < 0 || t.Ahead < 0 {
		return fmt.Errorf("partitioned table %q (key %q): interval %s must be at least a second, retention %s positive, accepts %s and ahead %s not negative",
			t.Name, t.Key, t.Interval, t.Retention, t.Accepts, t.Ahead)
	}
	return nil
}

// Reach is how far past the clock the partitions of t are made: Accepts,
// and then Ahead (or DefaultAhead) within two and MaxPartitionsAhead
// intervals.
func (t Table) Reach() time.Duration {
	ahead := min(cmp.Or(t.Ahead, DefaultAhead), MaxPartitionsAhead*t.Interval)
	return t.Accepts + max(ahead, 2*t.Interval)
}

// Config configures a Maintainer. Zero values take the defaults.
type Config struct {
	Tables []Table
	// Every is the pause between two rounds of maintenance (default half
	// the shortest Interval, within a second and a minute).
	Every time.Duration
	// LockTimeout bounds each step's wait for its locks (default 20ms);
	// a step that runs out is tried again, Attempts times in all (default
	// 20), and then at the next round.
	LockTimeout time.Duration
	Attempts    int
	// Observer, when set, is told of every step (metrics); package app
	// sets it.
	Observer Observer
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

// Observer is told what the maintenance does.
type Observer interface {
	// Step is one create or drop: how long it took (its locks included, the
	// longest it kept the table's writers waiting) and how it ended.
	Step(table, op string, d time.Duration, err error)
	// Partitions is the state of table after a round, also one that
	// failed once it had listed them: n partitions, its DEFAULT partition
	// included, the last of which ends at until.
	Partitions(table string, n int, until time.Time)
	// Maintained is the end of a round on table that succeeded, at the
	// maintenance's clock.
	Maintained(table string, at time.Time)
	// Unmoved is the end of a move out of the DEFAULT partition of table:
	// the rows of its range it could not move (the outbox's unsent ones,
	// counted up to a batch and one), none once it moved them all.
	Unmoved(table string, rows int)
}

type nopObserver struct{}

func (nopObserver) Step(string, string, time.Duration, error) {}
func (nopObserver) Partitions(string, int, time.Time)         {}
func (nopObserver) Maintained(string, time.Time)              {}
func (nopObserver) Unmoved(string, int)                       {}

// Result is what a round did to a table.
type Result struct {
	Created int // partitions added
	Dropped int // partitions dropped
	Kept    int // outbox partitions past retention kept for unsent or recently sent rows
	Cleaned int // rows deleted from the DEFAULT partition below the floor, which no partition takes
	// Partitions is how many partitions the table has after the round, its
	// DEFAULT partition included, and Until the upper bound of the last
	// one: also after a round that failed, unless it failed before it
	// listed them (Until zero).
	Partitions int
	Until      time.Time
}

// Maintainer keeps the partitions of its tables.
type Maintainer struct {
	pool    *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	queries *dbsqlc.Queries
}

// New returns a Maintainer of the tables of pool's database. Start it with
// Run.
func New(pool *pgxpool.Pool, cfg Config, logger *slog.Logger) *Maintainer {
	every := maxEvery
	for _, t := range cfg.Tables {
		every = min(every, t.Interval/2)
	}
	cfg.Every = cmp.Or(cfg.Every, max(every, time.Second))
	cfg.LockTimeout = cmp.Or(cfg.LockTimeout, defaultLockTimeout)
	cfg.Attempts = cmp.Or(cfg.Attempts, defaultAttempts)
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Maintainer{pool: pool, cfg: cfg, logger: logger.With("component", "partitions"), queries: dbsqlc.New()}
}

// Run maintains the tables at once and then every Config.Every until ctx
// is done, and returns nil then. A failed round is logged and tried again
// at the next.
func (m *Maintainer) Run(ctx context.Context) error {
	for _, t := range m.cfg.Tables {
		if err := t.validate(); err != nil {
			return err
		}
	}
	ticker := time.NewTicker(m.cfg.Every)
	defer ticker.Stop()
	for {
		for _, t := range m.cfg.Tables {
			res, err := m.Maintain(ctx, t)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				m.logger.WarnContext(ctx, "partition maintenance failed", "table", t.Name, "err", err,
					"created", res.Created, "dropped", res.Dropped)
			case res.Created > 0 || res.Dropped > 0:
				m.logger.InfoContext(ctx, "partitions maintained", "table", t.Name,
					"created", res.Created, "dropped", res.Dropped, "kept", res.Kept, "partitions", res.Partitions)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Maintain runs one round on t: it adds the partitions missing up to
// t.Reach() past the clock and drops those past t.Retention: detaches them,
// which holds the table's lock for a catalog change, and then drops them
// in a transaction of their own, whose commit waits for a WAL flush under
// no lock the table's writers take.
func (m *Maintainer) Maintain(ctx context.Context, t Table) (Result, error) {
	res, err := m.maintain(ctx, t)
	if !res.Until.IsZero() {
		m.cfg.Observer.Partitions(t.Name, res.Partitions, res.Until)
	}
	if err == nil {
		m.cfg.Observer.Maintained(t.Name, m.cfg.Now())
	}
	return res, err
}

// maintain is Maintain's round, which counts the partitions as it goes.
func (m *Maintainer) maintain(ctx context.Context, t Table) (Result, error) {
	var res Result
	// Those a process that stopped left detached first: a leftover holds
	// the name of the partition its range would be made in again.
	if err := m.dropDetached(ctx, t); err != nil {
		return res, err
	}
	parts, err := m.queries.Partitions(ctx, m.pool, t.Name)
	if err != nil {
		return res, fmt.Errorf("list partitions of %s: %w", t.Name, err)
	}
	res.Partitions, res.Until = len(parts), lastBound(parts)
	floor, err := m.queries.PartitionFloor(ctx, m.pool, t.Name)
	if err != nil {
		return res, fmt.Errorf("read the floor of %s: %w", t.Name, err)
	}
	now := m.cfg.Now()
	for _, r := range missing(t, parts, floor, now) {
		ok, err := m.create(ctx, t, r, now)
		if err != nil {
			return res, err
		}
		if ok {
			res.Created++
			res.Partitions++
			if r.hi.After(res.Until) {
				res.Until = r.hi
			}
		}
	}
	for _, p := range expired(t, parts, now) {
		ok, err := m.step(ctx, t.Name, "drop", func(lockTimeout string) (bool, error) {
			return m.drop(ctx, t, p.Name, lockTimeout)
		})
		if err != nil {
			return res, fmt.Errorf("drop partition %s: %w", p.Name, err)
		}
		if ok {
			res.Dropped++
			res.Partitions--
		} else {
			res.Kept++
		}
	}
	if res.Dropped > 0 {
		if err := m.dropDetached(ctx, t); err != nil {
			return res, err
		}
	}
	cleaned, err := m.cleanDefault(ctx, t)
	res.Cleaned = cleaned
	if err != nil {
		return res, err
	}
	if t.SentOnly {
		if err := m.prunePositions(ctx, t); err != nil {
			return res, err
		}
	}
	return res, nil
}

// create makes the partition r of t (false: it existed).
func (m *Maintainer) create(ctx context.Context, t Table, r span, now time.Time) (bool, error) {
	if err := m.prepare(ctx, t, r); err != nil {
		return false, fmt.Errorf("prepare partition of %s from %s: %w", t.Name, r.lo.Format(time.RFC3339), err)
	}
	ok, err := m.step(ctx, t.Name, "create", func(lockTimeout string) (bool, error) {
		return m.queries.CreatePartition(ctx, m.pool, dbsqlc.CreatePartitionParams{
			Parent: t.Name, Key: t.Key, Lo: r.lo, Hi: r.hi, LockTimeout: lockTimeout,
			Exclusive: r.lo.Before(now.Add(t.Accepts)),
		})
	})
	if err != nil {
		return false, fmt.Errorf("create partition of %s from %s: %w", t.Name, r.lo.Format(time.RFC3339), err)
	}
	return ok, nil
}

// drop detaches part of t, for the outbox only when every row in it was sent
// longer than the retention ago, in a READ COMMITTED transaction whatever the
// session's default: what partition_drop looks at under the table's lock
// (the outbox's check, the partitions that set the floor) must be what
// committed while it waited for it (it refuses otherwise).
func (m *Maintainer) drop(ctx context.Context, t Table, part, lockTimeout string) (bool, error) {
	var dropped bool
	err := pgx.BeginTxFunc(ctx, m.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var err error
		if t.SentOnly {
			dropped, err = m.queries.DropSentPartition(ctx, tx, dbsqlc.DropSentPartitionParams{
				Parent: t.Name, Part: part, LockTimeout: lockTimeout,
				Retention: pgtype.Interval{Microseconds: t.Retention.Microseconds(), Valid: true},
			})
		} else {
			dropped, err = m.queries.DropPartition(ctx, tx, dbsqlc.DropPartitionParams{Parent: t.Name, Part: part, LockTimeout: lockTimeout})
		}
		return err
	})
	return dropped, err
}

// dropDetached drops the partitions of t that drops detached, under no lock
// that the table's writers take, each waited for at most the lock timeout:
// one that a session still holds is kept for a later round, and this one
// goes on.
func (m *Maintainer) dropDetached(ctx context.Context, t Table) error {
	start := time.Now()
	res, err := m.queries.DropDetached(ctx, m.pool, dbsqlc.DropDetachedParams{Parent: t.Name, LockTimeout: m.lockTimeout()})
	m.cfg.Observer.Step(t.Name, "drop_detached", time.Since(start), err)
	if err != nil {
		return fmt.Errorf("drop detached partitions of %s: %w", t.Name, err)
	}
	if res.Locked > 0 {
		m.logger.WarnContext(ctx, "detached partitions in use kept for a later round", "table", t.Name, "kept", res.Locked)
	}
	return nil
}

// lockTimeout is Config.LockTimeout as PostgreSQL's lock_timeout setting.
func (m *Maintainer) lockTimeout() string {
	return fmt.Sprintf("%dms", max(m.cfg.LockTimeout.Milliseconds(), 1))
}

// prunePositions deletes the relay's positions older than the retention, but
// the one a redrive to then would go back to, and the relay's own: a few
// rows an interval, for one DELETE.
func (m *Maintainer) prunePositions(ctx context.Context, t Table) error {
	start := time.Now()
	_, err := m.queries.PruneOutboxPositions(ctx, m.pool, pgtype.Interval{Microseconds: t.Retention.Microseconds(), Valid: true})
	m.cfg.Observer.Step("outbox_batch", "prune", time.Since(start), err)
	if err != nil {
		return fmt.Errorf("prune the outbox relay's positions: %w", err)
	}
	return nil
}

// step runs one create or drop, again while it runs out of lock_timeout,
// with a growing pause that lets the transactions it waited for finish.
func (m *Maintainer) step(ctx context.Context, table, op string, run func(lockTimeout string) (bool, error)) (bool, error) {
	lockTimeout := m.lockTimeout()
	var err error
	for attempt := range m.cfg.Attempts {
		start := time.Now()
		var ok bool
		ok, err = run(lockTimeout)
		m.cfg.Observer.Step(table, op, time.Since(start), err)
		if !postgres.IsLockNotAvailable(err) {
			return ok, err
		}
		select {
		case <-ctx.Done():
			return false, errors.Join(err, ctx.Err())
		case <-time.After(time.Duration(attempt+1) * m.cfg.LockTimeout):
		}
	}
	return false, fmt.Errorf("%d attempts: %w", m.cfg.Attempts, err)
}

// span is a partition's range [lo, hi).
type span struct{ lo, hi time.Time }

// missing is the partitions to add to t: those of a gap between two
// partitions (one dropped by hand) that is not past the retention nor below
// the floor (where claims are refused: a partition there would admit
// events whose claims were dropped), and those that make the partitions reach
// t.Reach() past the clock: from the upper bound of the last partition on,
// in steps aligned on the interval. A gap since the last partition older
// than an interval (a database migrated long before its maintenance first
// ran) is covered by one partition up to the current interval.
func missing(t Table, parts []dbsqlc.PartitionsRow, floor, now time.Time) []span {
	until := now.Add(t.Reach())
	from := now.Truncate(t.Interval)
	last := lastBound(parts)
	spans := gaps(t, parts, floor, now)
	switch {
	case last.IsZero():
	case last.Before(from):
		spans = append(spans, span{last, from})
	default:
		from = last
	}
	return append(spans, steps(t, from, until)...)
}

// steps is [from, until) in partitions aligned on the interval of t, the
// last of which may end after until.
func steps(t Table, from, until time.Time) []span {
	var spans []span
	for lo := from; lo.Before(until); {
		hi := lo.Truncate(t.Interval).Add(t.Interval)
		spans = append(spans, span{lo, hi})
		lo = hi
	}
	return spans
}

// gaps is the partitions missing between those of t (parts, in the order of
// their bounds), but those past the retention, which would go at once, and
// those below the floor.
func gaps(t Table, parts []dbsqlc.PartitionsRow, floor, now time.Time) []span {
	var spans []span
	var prev time.Time
	for _, p := range parts {
		if p.IsDefault {
			continue
		}
		if !prev.IsZero() && p.Lo.After(prev) {
			for _, r := range steps(t, prev, p.Lo) {
				r.hi = minTime(r.hi, p.Lo)
				if r.hi.After(now.Add(-t.Retention)) && !r.lo.Before(floor) {
					spans = append(spans, r)
				}
			}
		}
		prev = p.Hi
	}
	return spans
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// lastBound is the upper bound of the last of parts but DEFAULT; zero if
// there is none.
func lastBound(parts []dbsqlc.PartitionsRow) time.Time {
	var last time.Time
	for _, p := range parts {
		if !p.IsDefault && p.Hi.After(last) {
			last = p.Hi
		}
	}
	return last
}

// expired is the partitions of t whose upper bound is older than the
// retention.
func expired(t Table, parts []dbsqlc.PartitionsRow, now time.Time) []dbsqlc.PartitionsRow {
	var old []dbsqlc.PartitionsRow
	for _, p := range parts {
		if !p.IsDefault && !p.Hi.After(now.Add(-t.Retention)) {
			old = append(old, p)
		}
	}
	return old
}
