package app

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/partition"
	"github.com/onceflow/onceflow/internal/postgres"
)

// partitionObserver exports the partition maintenance's metrics.
type partitionObserver struct {
	steps      *prometheus.HistogramVec
	partitions *prometheus.GaugeVec
	until      *prometheus.GaugeVec
	maintained *prometheus.GaugeVec
	unmoved    *prometheus.GaugeVec
}

var _ partition.Observer = partitionObserver{}

// newPartitionObserver registers the partition maintenance's metrics on reg.
func newPartitionObserver(reg prometheus.Registerer) (partitionObserver, error) {
	o := partitionObserver{
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_partition_step_duration_seconds",
			Help:    "Time a partition create or drop took, its lock wait included (bounded by its lock_timeout; result=lock_timeout: tried again), by table, op and result.",
			Buckets: latencyBuckets,
		}, []string{"table", "op", "result"}),
		partitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_partitions",
			Help: "Partitions of a time-partitioned table (processed_events, outbox) after the last maintenance round, failed or not, its DEFAULT partition included.",
		}, []string{"table"}),
		until: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_partitions_until_timestamp_seconds",
			Help: "Upper bound of the last partition of a time-partitioned table after the last maintenance round, failed or not, in Unix seconds: rows later than it go to the DEFAULT partition.",
		}, []string{"table"}),
		maintained: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_partition_maintenance_last_success_timestamp_seconds",
			Help: "End of the last partition maintenance round of a table that succeeded, in Unix seconds.",
		}, []string{"table"}),
		unmoved: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_partition_default_unmoved_rows",
			Help: "Rows of a range that the last move out of a table's DEFAULT partition could not move (the outbox's unsent rows, counted up to 5,001), which keep its partition from being made; 0 once a move moved them all.",
		}, []string{"table"}),
	}
	return o, errors.Join(reg.Register(o.steps), reg.Register(o.partitions), reg.Register(o.until), reg.Register(o.maintained),
		reg.Register(o.unmoved))
}

func (o partitionObserver) Step(table, op string, d time.Duration, err error) {
	result := "ok"
	switch {
	case err == nil:
	case postgres.IsLockNotAvailable(err):
		result = "lock_timeout"
	default:
		result = "error"
	}
	o.steps.WithLabelValues(table, op, result).Observe(d.Seconds())
}

func (o partitionObserver) Partitions(table string, n int, until time.Time) {
	o.partitions.WithLabelValues(table).Set(float64(n))
	o.until.WithLabelValues(table).Set(float64(until.UnixNano()) / 1e9)
}

func (o partitionObserver) Maintained(table string, at time.Time) {
	o.maintained.WithLabelValues(table).Set(float64(at.UnixNano()) / 1e9)
}

func (o partitionObserver) Unmoved(table string, rows int) {
	o.unmoved.WithLabelValues(table).Set(float64(rows))
}

// maintenance is the service's partition maintenance: the inbox and the
// outbox, with the intervals and retentions of cfg.
func maintenance(s *service) *partition.Maintainer {
	return partition.New(s.pool, partition.Config{
		Tables: []partition.Table{
			partition.InboxTable(s.cfg.InboxPartitionInterval, s.cfg.InboxRetention, s.cfg.InboxMaxSkew),
			partition.OutboxTable(s.cfg.OutboxPartitionInterval, s.cfg.OutboxRetention),
		},
		Observer: s.partitions,
	}, s.logger)
}
