package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/inbox"
	"github.com/onceflow/onceflow/internal/outbox"
)

// collector exports the inbox counters and the outbox lag at scrape time,
// so nothing is kept twice.
type collector struct {
	relay     *outbox.Relay
	consumers []*inbox.Consumer
	durables  []string

	inboxEvents  *prometheus.Desc
	outboxUnsent *prometheus.Desc
	outboxAge    *prometheus.Desc
}

func newCollector(relay *outbox.Relay, consumers []*inbox.Consumer, subs []Subscription) *collector {
	durables := make([]string, len(subs))
	for i, s := range subs {
		durables[i] = s.Durable
	}
	return &collector{
		relay:     relay,
		consumers: consumers,
		durables:  durables,
		inboxEvents: prometheus.NewDesc("onceflow_inbox_events_total",
			"Messages handled by an inbox consumer, by outcome.", []string{"consumer", "outcome"}, nil),
		outboxUnsent: prometheus.NewDesc("onceflow_outbox_unsent",
			"Outbox rows not yet published.", nil, nil),
		outboxAge: prometheus.NewDesc("onceflow_outbox_oldest_unsent_age_seconds",
			"Age of the oldest unpublished outbox row.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inboxEvents
	ch <- c.outboxUnsent
	ch <- c.outboxAge
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for i, cons := range c.consumers {
		s := cons.Stats()
		for outcome, n := range map[string]int64{
			"processed":     s.Processed,
			"duplicate":     s.Duplicates,
			"dead_lettered": s.DeadLettered,
			"retried":       s.Retried,
		} {
			ch <- prometheus.MustNewConstMetric(c.inboxEvents, prometheus.CounterValue, float64(n), c.durables[i], outcome)
		}
	}
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
