package app

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/telemetry"
)

// tracerName is the instrumentation scope of the consumers' spans.
const tracerName = "github.com/onceflow/onceflow/internal/inbox"

// Histogram buckets, in seconds: from a fast handler (sub-millisecond) to
// a transaction stuck behind a lock.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// metrics are a service's inbox and outbox metrics, on its own registry.
type metrics struct {
	inboxMessages        *prometheus.CounterVec
	inboxRedeliveries    *prometheus.CounterVec
	inboxHandlerErrors   *prometheus.CounterVec
	inboxHandlerDuration *prometheus.HistogramVec
	inboxTxDuration      *prometheus.HistogramVec
	inboxTxMessages      *prometheus.HistogramVec

	outboxPublished       *prometheus.CounterVec
	outboxRelayStep       *prometheus.HistogramVec
	outboxPublishErrors   prometheus.Counter
	outboxPublishDuration prometheus.Histogram
	outboxDelay           prometheus.Histogram
}

// newMetrics registers the inbox and outbox metrics on reg.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		inboxMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_inbox_messages_total",
			Help: "Messages settled by an inbox consumer, by event type and outcome (processed, duplicate, retried, dead_lettered, and dead_letter_refused: the DLQ refused the copy and the message is retried).",
		}, []string{"consumer", "event_type", "outcome"}),
		inboxRedeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_inbox_redeliveries_total",
			Help: "Messages an inbox consumer received again after an earlier delivery (nak, ack wait expired, crash).",
		}, []string{"consumer", "event_type"}),
		inboxHandlerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_inbox_handler_errors_total",
			Help: "Handler calls that failed, by returning an error or by a write they queued (their writes rolled back; the message retried or dead-lettered).",
		}, []string{"consumer", "event_type"}),
		inboxHandlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_inbox_handler_duration_seconds",
			Help:    "Time an event's handler took, inside the inbox transaction, until its writes were answered (queued writes go with the next read or the COMMIT).",
			Buckets: latencyBuckets,
		}, []string{"consumer", "event_type"}),
		inboxTxDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_inbox_transaction_duration_seconds",
			Help:    "Time an inbox transaction took from begin to commit (result=commit) or rollback (result=rollback).",
			Buckets: latencyBuckets,
		}, []string{"consumer", "result"}),
		inboxTxMessages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_inbox_transaction_messages",
			Help:    "Messages per inbox transaction (1 unbatched; up to the batch size batched).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}, []string{"consumer"}),
		outboxRelayStep: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "onceflow_outbox_relay_step_seconds",
			Help: "Time each step of a relay batch took: wait (from its oldest row's transaction start to its claim), " +
				"claim (round trip, records riding on it), publish, ack (last publish to last ack), record (sent alone).",
			Buckets: latencyBuckets,
		}, []string{"step"}),
		outboxPublished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_outbox_published_total",
			Help: "Outbox events the relay published and JetStream acknowledged, by event type.",
		}, []string{"event_type"}),
		outboxPublishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_outbox_publish_errors_total",
			Help: "Relay batches cut short by a publish that failed or was not acknowledged in time.",
		}),
		outboxPublishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_outbox_publish_duration_seconds",
			Help:    "Time a relay batch took from its first publish to its last JetStream ack.",
			Buckets: latencyBuckets,
		}),
		outboxDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_outbox_delay_seconds",
			Help:    "Age of an outbox event when JetStream acknowledged it: from its creation to its publish.",
			Buckets: latencyBuckets,
		}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{
		m.inboxMessages, m.inboxRedeliveries, m.inboxHandlerErrors, m.inboxHandlerDuration,
		m.inboxTxDuration, m.inboxTxMessages,
		m.outboxPublished, m.outboxPublishErrors, m.outboxPublishDuration, m.outboxDelay, m.outboxRelayStep,
	} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// consumerObserver is the inbox.Observer of one durable consumer: its
// metrics, a span per handled event (a child of the span that published
// it) and the event's ids on the handler's log records.
type consumerObserver struct {
	m        *metrics
	consumer string
	tracer   trace.Tracer
	// afterCommit, when set, is called for each processed event after its
	// transaction committed and before its ack: the fault hook behind
	// Config.FaultKillAfterCommit.
	afterCommit func(event.Envelope)
}

var _ inbox.Observer = consumerObserver{}

func (m *metrics) consumer(durable string, tp trace.TracerProvider) consumerObserver {
	return consumerObserver{m: m, consumer: durable, tracer: tp.Tracer(tracerName)}
}

func (o consumerObserver) Handle(ctx context.Context, ev event.Envelope) (context.Context, func(error)) {
	start := time.Now()
	ctx, span := o.startProcess(ctx, ev)
	ctx = telemetry.WithLogAttrs(ctx, slog.String("event_id", ev.ID.String()), slog.String("order_id", ev.Subject))
	return ctx, func(err error) {
		o.handled(ev.Type, time.Since(start), err)
		endSpan(span, err)
	}
}

// HandleBatch traces a set-based batch as OpenTelemetry suggests for batch
// processing: each event gets a span in its own trace that lasts as long as
// the batch, and the batch handler runs in a span of its own, a new root
// linked to them. The events it enqueues are not part of the batch's trace:
// they continue the traces of their causes (event.Caused; see
// outbox.Enqueue). Each event is charged an equal share of the batch's time,
// up to the answer of its writes (sent with the COMMIT), in the handler
// histogram.
func (o consumerObserver) HandleBatch(ctx context.Context, evs []event.Envelope) (context.Context, func(error)) {
	start := time.Now()
	spans := make([]trace.Span, len(evs))
	links := make([]trace.Link, len(evs))
	for i, ev := range evs {
		_, spans[i] = o.startProcess(ctx, ev)
		links[i] = trace.Link{SpanContext: spans[i].SpanContext()}
	}
	ctx, batch := o.tracer.Start(ctx, "process batch "+o.consumer,
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.consumer.group.name", o.consumer),
			attribute.Int("messaging.batch.message_count", len(evs)),
		))
	return ctx, func(err error) {
		share := time.Since(start) / time.Duration(max(len(evs), 1))
		for i, ev := range evs {
			o.handled(ev.Type, share, err)
			endSpan(spans[i], err)
		}
		endSpan(batch, err)
	}
}

// startProcess starts the span of handling ev: a child of the span that
// published it.
func (o consumerObserver) startProcess(ctx context.Context, ev event.Envelope) (context.Context, trace.Span) {
	subject, _ := ev.Type.NATSSubject() // decoded events have a known type
	return o.tracer.Start(telemetry.ContextWithTraceParent(ctx, ev.TraceParent), "process "+subject,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", subject),
			attribute.String("messaging.consumer.group.name", o.consumer),
			attribute.String("messaging.message.id", ev.ID.String()),
			attribute.String("cloudevents.event_type", string(ev.Type)),
			attribute.String("cloudevents.event_subject", ev.Subject),
		))
}

func (o consumerObserver) handled(typ event.Type, d time.Duration, err error) {
	o.m.inboxHandlerDuration.WithLabelValues(o.consumer, string(typ)).Observe(d.Seconds())
	if err != nil {
		o.m.inboxHandlerErrors.WithLabelValues(o.consumer, string(typ)).Inc()
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func (o consumerObserver) Transaction(messages int, d time.Duration, err error) {
	result := "commit"
	if err != nil {
		result = "rollback"
	}
	o.m.inboxTxDuration.WithLabelValues(o.consumer, result).Observe(d.Seconds())
	o.m.inboxTxMessages.WithLabelValues(o.consumer).Observe(float64(messages))
}

func (o consumerObserver) Settled(ev event.Envelope, outcome inbox.Outcome, deliveries uint64) {
	// An undecodable message has no type; its header is not a label value
	// to trust.
	typ := cmp.Or(string(ev.Type), "unknown")
	o.m.inboxMessages.WithLabelValues(o.consumer, typ, string(outcome)).Inc()
	if deliveries > 1 {
		o.m.inboxRedeliveries.WithLabelValues(o.consumer, typ).Inc()
	}
	if outcome == inbox.OutcomeProcessed && o.afterCommit != nil {
		o.afterCommit(ev)
	}
}

// relayObserver is the outbox.RelayObserver of a service's relay.
type relayObserver struct{ m *metrics }

var _ outbox.RelayObserver = relayObserver{}

func (o relayObserver) Published(_ int, d time.Duration, err error) {
	o.m.outboxPublishDuration.Observe(d.Seconds())
	if err != nil {
		o.m.outboxPublishErrors.Inc()
	}
}

func (o relayObserver) Step(step string, d time.Duration) {
	o.m.outboxRelayStep.WithLabelValues(step).Observe(d.Seconds())
}

func (o relayObserver) Acked(typ event.Type, age time.Duration) {
	o.m.outboxPublished.WithLabelValues(string(typ)).Inc()
	o.m.outboxDelay.Observe(max(age, 0).Seconds())
}

// statsCollector exports the outbox lag, read from the database at scrape
// time: it is state, not something the relay observes as it happens.
type statsCollector struct {
	relay        *outbox.Relay
	outboxUnsent *prometheus.Desc
	outboxAge    *prometheus.Desc
}

func newStatsCollector(relay *outbox.Relay) *statsCollector {
	return &statsCollector{
		relay: relay,
		outboxUnsent: prometheus.NewDesc("onceflow_outbox_unsent",
			"Outbox rows not yet published.", nil, nil),
		outboxAge: prometheus.NewDesc("onceflow_outbox_oldest_unsent_age_seconds",
			"Age of the oldest unpublished outbox row.", nil, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.outboxUnsent
	ch <- c.outboxAge
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lag, err := c.relay.Lag(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.outboxUnsent, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.outboxUnsent, prometheus.GaugeValue, float64(lag.Unsent))
	ch <- prometheus.MustNewConstMetric(c.outboxAge, prometheus.GaugeValue, lag.OldestAge.Seconds())
}

// poolCollector exports a database pool's statistics at scrape time, with
// the pool's name as the label "pool": a pool too small for the load shows
// as acquire waits.
type poolCollector struct {
	pool                                 *pgxpool.Pool
	name                                 string
	acquired, idle, max, waits, waitTime *prometheus.Desc
}

func newPoolCollector(pool *pgxpool.Pool, name string) *poolCollector {
	labels := prometheus.Labels{"pool": name}
	return &poolCollector{
		pool: pool,
		name: name,
		acquired: prometheus.NewDesc("onceflow_db_pool_acquired_connections",
			"Database connections in use.", nil, labels),
		idle: prometheus.NewDesc("onceflow_db_pool_idle_connections",
			"Database connections idle in the pool.", nil, labels),
		max: prometheus.NewDesc("onceflow_db_pool_max_connections",
			"The pool's maximum number of connections.", nil, labels),
		waits: prometheus.NewDesc("onceflow_db_pool_empty_acquires_total",
			"Acquires that waited because the pool had no idle connection.", nil, labels),
		waitTime: prometheus.NewDesc("onceflow_db_pool_empty_acquire_wait_seconds_total",
			"Time spent waiting for a connection when the pool had none idle.", nil, labels),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.acquired
	ch <- c.idle
	ch <- c.max
	ch <- c.waits
	ch <- c.waitTime
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(s.IdleConns()))
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waitTime, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
}
