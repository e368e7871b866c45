package partition

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/partition/internal/dbsqlc"
	"github.com/onceflow/onceflow/internal/postgres"
)

const (
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
	// transaction). Partitions are made two intervals further ahead, so
	// that a new partition's range is one where nobody writes yet, and
	// attaching it keeps no writer waiting.
	Accepts time.Duration
	// Retention: a partition whose upper bound is older than it is dropped.
	Retention time.Duration
	// SentOnly keeps an outbox partition while it holds a row unsent or sent
	// less than Retention ago.
	SentOnly bool
	// Sent, when set, is the table that records the sends of Name's rows,
	// partitioned by the same key with the same bounds and names
	// (outbox_sent_pX beside outbox_pX). Its partition of a range is made
	// before Name's and detached after Name's went, each in a transaction
	// of its own, so that no step holds locks of both tables, and a row of
	// Name always has the partition its send goes to.
	Sent string
}

func (t Table) validate() error {
	if t.Name == "" || t.Key == "" || t.Interval < time.Second || t.Retention <= 0 || t.Accepts < 0 {
		return fmt.Errorf("partitioned table %q (key %q): interval %s must be at least a second, retention %s positive, accepts %s not negative",
			t.Name, t.Key, t.Interval, t.Retention, t.Accepts)
	}
	return nil
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
	// Partitions is the number of partitions of table after a round.
	Partitions(table string, n int)
}

type nopObserver struct{}

func (nopObserver) Step(string, string, time.Duration, error) {}
func (nopObserver) Partitions(string, int)                    {}

// Result is what a round did to a table.
type Result struct {
	Created int // partitions added
	Dropped int // partitions dropped
	Kept    int // outbox partitions past retention kept for unsent or recently sent rows
	// Partitions is how many partitions the table has after the round, its
	// DEFAULT partition included.
	Partitions int
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

// Maintain runs one round on t: it adds the partitions missing up to two
// intervals past Accepts and drops those past t.Retention: detaches them,
// which holds the table's lock for a catalog change, and then drops them
// in a transaction of their own, whose commit waits for a WAL flush under
// no lock the table's writers take.
func (m *Maintainer) Maintain(ctx context.Context, t Table) (Result, error) {
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
	now := m.cfg.Now()
	for _, r := range missing(t, parts, now) {
		ok, err := m.create(ctx, t, r, now)
		if err != nil {
			return res, err
		}
		if ok {
			res.Created++
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
		} else {
			res.Kept++
		}
	}
	sentDropped := 0
	if t.Sent != "" {
		if sentDropped, err = m.dropSent(ctx, t, now); err != nil {
			return res, err
		}
	}
	if res.Dropped > 0 || sentDropped > 0 {
		if err := m.dropDetached(ctx, t); err != nil {
			return res, err
		}
	}
	res.Partitions = len(parts) + res.Created - res.Dropped
	m.cfg.Observer.Partitions(t.Name, res.Partitions)
	return res, nil
}

// create makes the partition r of t, and first, for a table with Sent, the
// partition of t.Sent of the same range (false: it existed). Made first, so
// that the sends of r's rows never wait in t.Sent's DEFAULT partition.
func (m *Maintainer) create(ctx context.Context, t Table, r span, now time.Time) (bool, error) {
	tables := []string{t.Name}
	if t.Sent != "" {
		tables = []string{t.Sent, t.Name}
	}
	var created bool
	for _, name := range tables {
		ok, err := m.step(ctx, name, "create", func(lockTimeout string) (bool, error) {
			return m.queries.CreatePartition(ctx, m.pool, dbsqlc.CreatePartitionParams{
				Parent: name, Key: t.Key, Lo: r.lo, Hi: r.hi, LockTimeout: lockTimeout,
				Exclusive: r.lo.Before(now.Add(t.Accepts)),
			})
		})
		if err != nil {
			return false, fmt.Errorf("create partition of %s from %s: %w", name, r.lo.Format(time.RFC3339), err)
		}
		created = ok
	}
	return created, nil
}

// dropSent detaches the partitions of t.Sent past the retention whose
// partition of t is gone (dropped in this round, or in one that stopped
// before it came to this), each in a transaction of its own: the relay
// takes outbox_sent's locks before the outbox's, so a step that locked
// both could deadlock with it. The sends recorded there are of rows that
// are gone. It returns how many it detached.
func (m *Maintainer) dropSent(ctx context.Context, t Table, now time.Time) (int, error) {
	sent, err := m.queries.Partitions(ctx, m.pool, t.Sent)
	if err != nil {
		return 0, fmt.Errorf("list partitions of %s: %w", t.Sent, err)
	}
	parts, err := m.queries.Partitions(ctx, m.pool, t.Name)
	if err != nil {
		return 0, fmt.Errorf("list partitions of %s: %w", t.Name, err)
	}
	kept := make(map[string]bool, len(parts))
	for _, p := range parts {
		kept[t.Sent+strings.TrimPrefix(p.Name, t.Name)] = true
	}
	dropped := 0
	for _, p := range expired(t, sent, now) {
		if kept[p.Name] {
			continue
		}
		ok, err := m.step(ctx, t.Sent, "drop", func(lockTimeout string) (bool, error) {
			return m.queries.DropPartition(ctx, m.pool, dbsqlc.DropPartitionParams{Parent: t.Sent, Part: p.Name, LockTimeout: lockTimeout})
		})
		if err != nil {
			return dropped, fmt.Errorf("drop partition %s: %w", p.Name, err)
		}
		if ok {
			dropped++
		}
	}
	return dropped, nil
}

func (m *Maintainer) drop(ctx context.Context, t Table, part, lockTimeout string) (bool, error) {
	if !t.SentOnly {
		return m.queries.DropPartition(ctx, m.pool, dbsqlc.DropPartitionParams{Parent: t.Name, Part: part, LockTimeout: lockTimeout})
	}
	return m.queries.DropSentPartition(ctx, m.pool, dbsqlc.DropSentPartitionParams{
		Parent: t.Name, Part: part, LockTimeout: lockTimeout,
		Retention: pgtype.Interval{Microseconds: t.Retention.Microseconds(), Valid: true},
	})
}

// dropDetached drops the partitions of t (and of t.Sent) that drops
// detached, under no lock that the table's writers take.
func (m *Maintainer) dropDetached(ctx context.Context, t Table) error {
	for _, name := range []string{t.Name, t.Sent} {
		if name == "" {
			continue
		}
		start := time.Now()
		_, err := m.queries.DropDetached(ctx, m.pool, name)
		m.cfg.Observer.Step(name, "drop_detached", time.Since(start), err)
		if err != nil {
			return fmt.Errorf("drop detached partitions of %s: %w", name, err)
		}
	}
	return nil
}

// step runs one create or drop, again while it runs out of lock_timeout,
// with a growing pause that lets the transactions it waited for finish.
func (m *Maintainer) step(ctx context.Context, table, op string, run func(lockTimeout string) (bool, error)) (bool, error) {
	lockTimeout := fmt.Sprintf("%dms", max(m.cfg.LockTimeout.Milliseconds(), 1))
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

// missing is the partitions to add to t so that they reach two intervals
// past Accepts: from the upper bound of the last partition on, in steps
// aligned on the interval. A gap since the last partition older than
// an interval (a database migrated long before its maintenance first ran)
// is covered by one partition up to the current interval.
func missing(t Table, parts []dbsqlc.PartitionsRow, now time.Time) []span {
	until := now.Add(t.Accepts + 2*t.Interval)
	from := now.Truncate(t.Interval)
	var last time.Time
	for _, p := range parts {
		if !p.IsDefault && p.Hi.After(last) {
			last = p.Hi
		}
	}
	var spans []span
	switch {
	case last.IsZero():
	case last.Before(from):
		spans = append(spans, span{last, from})
	default:
		from = last
	}
	for lo := from; lo.Before(until); {
		hi := lo.Truncate(t.Interval).Add(t.Interval)
		spans = append(spans, span{lo, hi})
		lo = hi
	}
	return spans
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
