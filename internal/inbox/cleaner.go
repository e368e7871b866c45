package inbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox/internal/dbsqlc"
)

const (
	defaultCleanInterval  = time.Hour
	defaultCleanBatchSize = 10_000
	// cleanMargin is how much longer than the retention a row is kept. A
	// consumer that let an event through its retention guard just before
	// the retention ran out claims it moments later (within a batch's
	// processing), and must still find the row of an earlier processing.
	cleanMargin = time.Hour
)

// CleanerConfig configures a Cleaner. Zero values take the defaults.
type CleanerConfig struct {
	// Retention is how long rows are kept, counted from the time in the
	// event's id (default DefaultRetention); the Cleaner adds cleanMargin.
	// It must equal the consumers' Config.Retention and exceed the stream's
	// max age plus the consumers' lag: a redelivery whose row is gone would
	// be processed again, were it not for the consumers' retention guard.
	Retention time.Duration
	// Interval is the time between two cleanings (default 1h).
	Interval time.Duration
	// BatchSize is the most rows one statement deletes (default 10000), so
	// that no statement holds its locks for long.
	BatchSize int
}

// Cleaner deletes the processed_events rows of events minted before the
// retention period: their ids, UUIDv7s, carry that time, so the rows go in
// primary key order and the table needs no index of its own for them.
type Cleaner struct {
	pool    *pgxpool.Pool
	cfg     CleanerConfig
	logger  *slog.Logger
	queries *dbsqlc.Queries
}

// NewCleaner returns a Cleaner of the database of pool.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig, logger *slog.Logger) *Cleaner {
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.Interval = cmp.Or(cfg.Interval, defaultCleanInterval)
	cfg.BatchSize = min(cmp.Or(cfg.BatchSize, defaultCleanBatchSize), math.MaxInt32)
	return &Cleaner{pool: pool, cfg: cfg, logger: logger, queries: dbsqlc.New()}
}

// Run cleans at once and then every Interval until ctx is done, and returns
// nil then. A failed cleaning is logged and retried at the next interval.
func (c *Cleaner) Run(ctx context.Context) error {
	if c.cfg.Retention <= 0 || c.cfg.Interval <= 0 || c.cfg.BatchSize <= 0 {
		return fmt.Errorf("inbox cleaner: retention %s, interval %s and batch size %d must be positive",
			c.cfg.Retention, c.cfg.Interval, c.cfg.BatchSize)
	}
	ticker := time.NewTicker(c.cfg.Interval)
	defer ticker.Stop()
	for {
		n, err := c.Clean(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			c.logger.WarnContext(ctx, "inbox cleaning failed", "deleted", n, "err", err)
		case n > 0:
			c.logger.InfoContext(ctx, "inbox cleaned", "deleted", n, "retention", c.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Clean deletes the rows of events minted more than Retention (and
// cleanMargin) ago, BatchSize rows per statement, and returns how many it
// deleted. The consumers dead-letter such an event rather than process it,
// so its row is no longer needed.
func (c *Cleaner) Clean(ctx context.Context) (int64, error) {
	before := time.Now().Add(-c.cfg.Retention - cleanMargin)
	arg := dbsqlc.DeleteMintedBeforeParams{BeforeID: event.FirstIDAt(before), MaxRows: int32(c.cfg.BatchSize)}
	var total int64
	for {
		n, err := c.queries.DeleteMintedBefore(ctx, c.pool, arg)
		total += n
		if err != nil {
			return total, fmt.Errorf("delete processed events minted before %s: %w", before.Format(time.RFC3339), err)
		}
		if n < int64(c.cfg.BatchSize) {
			return total, nil
		}
	}
}
