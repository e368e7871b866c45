package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/panics"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/order/internal/dbsqlc"
)

// Expiry defaults.
const (
	// DefaultDeadline is how long an order has to finish: far longer than
	// the saga takes even when it is behind, so that only a participant that
	// is down or a message left in the DLQ lets an order expire.
	DefaultDeadline = 15 * time.Minute
	// DefaultExpiryInterval is the longest the expirer sleeps.
	DefaultExpiryInterval = time.Second
	// DefaultExpiryBatch is how many orders one transaction expires.
	DefaultExpiryBatch = 100
	// minExpiryWait keeps an expirer from spinning on a due order that an
	// event handler holds locked (it skips it) until the handler commits.
	minExpiryWait = 20 * time.Millisecond
)

// ReasonDeadline is the reason recorded with an OrderExpired.
const ReasonDeadline = "deadline"

// ExpirerConfig configures an Expirer; zero values take the defaults.
type ExpirerConfig struct {
	Interval  time.Duration // longest sleep between two looks for due orders
	BatchSize int           // orders expired per transaction
}

// Expirer ends the orders still open (PENDING or PAID) past their deadline:
// each becomes EXPIRED, and its OrderExpired enters the outbox and its
// timeline, in one transaction, so that payment and inventory compensate
// whatever they did for it (docs/saga.md).
//
// It reads the due orders from an index of the open orders' deadlines and
// locks them with FOR UPDATE SKIP LOCKED, so that several replicas of the
// order service expire disjoint orders and never wait for an event handler
// (which locks the order it applies an event to): an order a handler holds
// is expired on a later round if it is still open then. Expiring is
// idempotent: an EXPIRED order is no longer open, and the status changes in
// the transaction that emits the event.
type Expirer struct {
	pool    *pgxpool.Pool
	queries *dbsqlc.Queries
	cfg     ExpirerConfig
	logger  *slog.Logger
	// lag is how late each order was expired, after its deadline.
	lag prometheus.Histogram
}

// NewExpirer returns the expirer of the orders in pool's database.
func NewExpirer(pool *pgxpool.Pool, cfg ExpirerConfig, logger *slog.Logger) *Expirer {
	cfg.Interval = cmp.Or(cfg.Interval, DefaultExpiryInterval)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultExpiryBatch)
	return &Expirer{
		pool: pool, queries: dbsqlc.New(), cfg: cfg, logger: logger,
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_order_expiry_lag_seconds",
			Help:    "How long after its deadline an order was expired.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 30},
		}),
	}
}

// Collector returns the expirer's metrics.
func (e *Expirer) Collector() prometheus.Collector { return e.lag }

// Run expires due orders until ctx is done. A round that fails is logged
// and tried again: nothing of it was committed.
func (e *Expirer) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		// A panic is the round's failure, not the service's: its
		// transaction rolls back (ExpireDue's deferred Rollback) and the
		// next round tries again, as the inbox does with a handler's.
		var n int
		err := panics.Recover(func() (err error) {
			n, err = e.ExpireDue(ctx)
			return err
		})
		if err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "expire due orders", "err", err, "stack", string(panics.Stack(err)))
		}
		wait := time.Duration(0)
		if n < e.cfg.BatchSize {
			wait = e.untilNext(ctx)
		}
		timer.Reset(wait)
	}
}

// untilNext is how long to sleep before the next round: until the earliest
// deadline of an open order, at most the interval.
func (e *Expirer) untilNext(ctx context.Context) time.Duration {
	next, err := e.queries.NextDeadline(ctx, e.pool)
	if err != nil || next == nil {
		return e.cfg.Interval
	}
	return min(max(time.Until(*next), minExpiryWait), e.cfg.Interval)
}

// ExpireDue expires up to a batch of the orders due now, in one
// transaction, and returns how many it expired. The batch's writes go in
// one round trip (set-based statuses, outbox rows and timeline entries): a
// restart past many deadlines expires them all within the second.
func (e *Expirer) ExpireDue(ctx context.Context) (int, error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	now := time.Now()
	due, err := e.queries.ClaimDueOrders(ctx, tx, dbsqlc.ClaimDueOrdersParams{Now: now, MaxRows: int32(e.cfg.BatchSize)})
	if err != nil {
		return 0, fmt.Errorf("claim due orders: %w", err)
	}
	if len(due) == 0 {
		return 0, nil
	}
	var (
		evs      []event.Envelope
		statuses dbsqlc.SetOrderStatusesParams
		timeline dbsqlc.InsertTimelinesParams
	)
	for _, o := range due {
		ev, err := expiredEvent(o)
		if err != nil {
			return 0, err
		}
		evs = append(evs, ev)
		statuses.Ids = append(statuses.Ids, o.ID)
		statuses.Statuses = append(statuses.Statuses, StatusExpired)
		timeline.OrderIds = append(timeline.OrderIds, o.ID)
		timeline.EventIds = append(timeline.EventIds, ev.ID)
		timeline.EventTypes = append(timeline.EventTypes, string(ev.Type))
		timeline.Ats = append(timeline.Ats, ev.Time)
		timeline.Reasons = append(timeline.Reasons, ReasonDeadline)
	}
	var writes postgres.Pipeline
	if err := e.queries.SetOrderStatuses(ctx, &writes, statuses); err != nil {
		return 0, fmt.Errorf("expire %d orders: %w", len(due), err)
	}
	if err := outbox.QueueBatch(ctx, &writes, evs); err != nil {
		return 0, err
	}
	if err := e.queries.InsertTimelines(ctx, &writes, timeline); err != nil {
		return 0, fmt.Errorf("record %d expiries in the timelines: %w", len(due), err)
	}
	if err := writes.Send(ctx, tx); err != nil {
		return 0, fmt.Errorf("expire %d orders: %w", len(due), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit %d expiries: %w", len(due), err)
	}
	for _, o := range due {
		e.lag.Observe(now.Sub(*o.Deadline).Seconds())
	}
	return len(due), nil
}

// expiredEvent is the OrderExpired of the locked, due order o.
func expiredEvent(o dbsqlc.Order) (event.Envelope, error) {
	if o.Deadline == nil {
		return event.Envelope{}, errors.New("an order without a deadline is never due")
	}
	return event.New(Name, event.OrderExpired, o.ID.String(), event.OrderExpiredV1{
		Order:      event.Order{OrderID: o.ID, CustomerID: o.CustomerID, CustomerEmail: o.CustomerEmail},
		Deadline:   *o.Deadline,
		Status:     o.Status,
		TotalCents: o.TotalCents,
	})
}
