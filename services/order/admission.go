package order

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/order/internal/dbsqlc"
)

// Admission defaults.
const (
	DefaultMaxOrdersInFlight = 2000
	admissionInterval        = 100 * time.Millisecond
	// admissionRetryAfter is the Retry-After of a refused order: long enough
	// for the saga to finish a good share of what it has.
	admissionRetryAfter = time.Second
)

// Admission refuses new orders while the saga is too far behind.
//
// Without it, a flood of POST /orders outruns the saga: each accepted order
// costs a commit that competes with the saga's own, the saga slows down, and
// on a durable deployment a minute of it left tens of thousands of orders
// PENDING while the API kept accepting more. With it, the API answers 503
// with Retry-After once MaxInFlight orders are unfinished, and the clients'
// retries wait their turn.
//
// The count comes from the database, every admissionInterval, so that it
// holds across replicas of the order service; between two counts the
// replicas may together accept a few more orders than the limit.
type Admission struct {
	pool     *pgxpool.Pool
	queries  *dbsqlc.Queries
	max      int64 // no limit when negative
	logger   *slog.Logger
	inFlight atomic.Int64
	refused  atomic.Int64
}

// NewAdmission returns the admission of at most maxInFlight unfinished
// orders: zero means DefaultMaxOrdersInFlight, negative no limit.
func NewAdmission(pool *pgxpool.Pool, maxInFlight int, logger *slog.Logger) *Admission {
	if maxInFlight == 0 {
		maxInFlight = DefaultMaxOrdersInFlight
	}
	return &Admission{pool: pool, queries: dbsqlc.New(), max: int64(maxInFlight), logger: logger}
}

// Run counts the unfinished orders until ctx is done. A count that fails
// keeps the last one: the limit is a safeguard, not a correctness rule.
func (a *Admission) Run(ctx context.Context) error {
	if a.max < 0 {
		return nil
	}
	t := time.NewTicker(admissionInterval)
	defer t.Stop()
	for {
		if err := a.count(ctx); err != nil && ctx.Err() == nil {
			a.logger.WarnContext(ctx, "count orders in flight", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (a *Admission) count(ctx context.Context) error {
	n, err := a.queries.CountOrdersInFlight(ctx, a.pool)
	if err != nil {
		return fmt.Errorf("count orders in flight: %w", err)
	}
	a.inFlight.Store(n)
	return nil
}

// admit returns a 503 problem when the saga has MaxInFlight orders or more
// unfinished, else nil.
func (a *Admission) admit() error {
	if a == nil || a.max < 0 {
		return nil
	}
	if n := a.inFlight.Load(); n >= a.max {
		a.refused.Add(1)
		return httpapi.Unavailable(admissionRetryAfter,
			"%d orders are still in flight (the limit is %d); try again later with the same Idempotency-Key", n, a.max)
	}
	return nil
}

// Collector returns the admission's metrics.
func (a *Admission) Collector() prometheus.Collector {
	return &admissionCollector{
		a: a,
		inFlight: prometheus.NewDesc("onceflow_order_in_flight",
			"Orders not yet in a terminal state, as last counted by the admission of POST /orders.", nil, nil),
		refused: prometheus.NewDesc("onceflow_order_admission_refused_total",
			"POST /orders answered 503 because too many orders were in flight.", nil, nil),
	}
}

type admissionCollector struct {
	a                 *Admission
	inFlight, refused *prometheus.Desc
}

func (c *admissionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inFlight
	ch <- c.refused
}

func (c *admissionCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(c.a.inFlight.Load()))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(c.a.refused.Load()))
}

// Defaults of the per-caller limit on POST /orders.
const (
	DefaultOrdersPerSecond = 100
	DefaultOrdersBurst     = 200
)

// perCaller is the middleware that limits each caller's POST /orders, or
// nil for none.
func (cfg Config) perCaller() echo.MiddlewareFunc {
	if cfg.OrdersPerSecond < 0 {
		return nil
	}
	perSecond := cmp.Or(cfg.OrdersPerSecond, DefaultOrdersPerSecond)
	burst := cmp.Or(cfg.OrdersBurst, DefaultOrdersBurst)
	return httpapi.PerCaller(perSecond, burst, func(c echo.Context) string {
		caller, _ := auth.Caller(c)
		return caller.Subject
	})
}
