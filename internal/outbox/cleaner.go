package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/outbox/internal/dbsqlc"
)

const (
	defaultRetention        = time.Hour
	defaultCleanInterval    = time.Minute
	defaultCleanerBatchSize = 1000
)

// CleanerConfig configures a Cleaner. Zero values take the defaults.
type CleanerConfig struct {
	// Retention is how long a sent row is kept. Default 1h.
	//
	// It must be at least the duplicate window of the streams the outbox
	// publishes to: a publish ack is not an fsync, so a broker can lose an
	// acknowledged event, and the kept rows are the window in which Redrive
	// can publish it again. Within the duplicate window a republish is
	// dropped by the broker if the event survived; past it, by the
	// consumers' inbox.
	Retention time.Duration
	// Interval is the pause between two cleanings. Default 1m.
	Interval time.Duration
	// BatchSize is the most rows one DELETE removes, which keeps its locks
	// and WAL short. Default 1000.
	BatchSize int
}

// Cleaner deletes sent outbox rows once they are older than the retention
// period. Unsent rows are never deleted.
type Cleaner struct {
	pool    *pgxpool.Pool
	cfg     CleanerConfig
	logger  *slog.Logger
	queries *dbsqlc.Queries
}

// NewCleaner returns a cleaner of the outbox in pool's database. Start it
// with Run.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig, logger *slog.Logger) *Cleaner {
	cfg.Retention = cmp.Or(max(cfg.Retention, 0), defaultRetention)
	cfg.Interval = cmp.Or(max(cfg.Interval, 0), defaultCleanInterval)
	cfg.BatchSize = min(cmp.Or(max(cfg.BatchSize, 0), defaultCleanerBatchSize), math.MaxInt32)
	return &Cleaner{
		pool:    pool,
		cfg:     cfg,
		logger:  logger.With("component", "outbox-cleaner"),
		queries: dbsqlc.New(),
	}
}

// Run cleans at once and then every Interval until ctx is done, and returns
// nil then. A failed cleaning is logged and tried again at the next
// interval.
func (c *Cleaner) Run(ctx context.Context) error {
	ticker := time.NewTicker(c.cfg.Interval)
	defer ticker.Stop()
	for {
		n, err := c.Clean(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			c.logger.WarnContext(ctx, "clean outbox", "error", err, "deleted", n)
		case n > 0:
			c.logger.InfoContext(ctx, "outbox cleaned", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Clean deletes the sent rows older than the retention period, batch by
// batch, and returns how many it deleted.
func (c *Cleaner) Clean(ctx context.Context) (int64, error) {
	arg := dbsqlc.DeleteSentOlderThanParams{
		Retention: pgtype.Interval{Microseconds: c.cfg.Retention.Microseconds(), Valid: true},
		MaxRows:   int32(c.cfg.BatchSize),
	}
	var total int64
	for {
		n, err := c.queries.DeleteSentOlderThan(ctx, c.pool, arg)
		total += n
		if err != nil {
			return total, fmt.Errorf("delete sent outbox rows: %w", err)
		}
		if n < int64(c.cfg.BatchSize) {
			return total, nil
		}
	}
}
