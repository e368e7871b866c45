package streams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream and consumer names of the order saga.
const (
	Orders    = "ORDERS"
	Payments  = "PAYMENTS"
	Inventory = "INVENTORY"
	// DLQ holds messages that could not be processed, on "dlq.<consumer>",
	// with the reason in a header.
	DLQ = "DLQ"

	PaymentOrders     = "payment-orders"     // payment ← OrderPlaced
	PaymentInventory  = "payment-inventory"  // payment ← StockRejected
	InventoryPayments = "inventory-payments" // inventory ← PaymentDebited
	OrderPayments     = "order-payments"     // order ← PaymentDebited/Rejected/Refunded
	OrderInventory    = "order-inventory"    // order ← StockReserved/Rejected
	NotifyOrders      = "notify-orders"      // notify ← order milestones

	// DLQSubjectPrefix prefixes the consumer name on dead-letter subjects.
	DLQSubjectPrefix = "dlq."
)

const (
	defaultMaxDeliver  = 10
	defaultAckWait     = 30 * time.Second
	defaultDupWindow   = 2 * time.Minute
	defaultMaxAge      = 72 * time.Hour
	defaultDLQMaxAge   = 30 * 24 * time.Hour
	defaultMaxAckPend  = 1000
	defaultReplicas    = 1
	defaultStorageType = jetstream.FileStorage
)

// Config is what differs between deployments. Zero values take the defaults.
type Config struct {
	Replicas        int                   // default 1; 3 on a cluster
	Storage         jetstream.StorageType // default file
	DuplicateWindow time.Duration         // default 2m; the outbox keeps sent rows at least this long
	MaxAge          time.Duration         // default 72h; the inbox retention must exceed it
	DLQMaxAge       time.Duration         // default 30 days
}

// Stream is one stream of the topology.
type Stream struct {
	Name     string
	Subjects []string
	MaxAge   time.Duration
}

// Consumer is one durable pull consumer: one per (service, subscription).
type Consumer struct {
	Stream         string
	Durable        string
	FilterSubjects []string
	// AckWait must be longer than a handler (or a batch) needs; BackOff, when
	// set, replaces it per delivery. MaxDeliver bounds redeliveries, after
	// which the inbox dead-letters the message.
	AckWait       time.Duration
	BackOff       []time.Duration
	MaxDeliver    int
	MaxAckPending int
}

// Topology is a complete description of streams and consumers.
type Topology struct {
	Config    Config
	Streams   []Stream
	Consumers []Consumer
}

// Saga is the topology of the order saga.
func Saga(cfg Config) Topology {
	return Topology{
		Config: cfg,
		Streams: []Stream{
			{Name: Orders, Subjects: []string{"orders.>"}},
			{Name: Payments, Subjects: []string{"payments.>"}},
			{Name: Inventory, Subjects: []string{"inventory.>"}},
		},
		Consumers: []Consumer{
			{Stream: Orders, Durable: PaymentOrders, FilterSubjects: []string{"orders.placed.v1"}},
			{Stream: Inventory, Durable: PaymentInventory, FilterSubjects: []string{"inventory.rejected.v1"}},
			{Stream: Payments, Durable: InventoryPayments, FilterSubjects: []string{"payments.debited.v1"}},
			{Stream: Payments, Durable: OrderPayments, FilterSubjects: []string{"payments.>"}},
			{Stream: Inventory, Durable: OrderInventory, FilterSubjects: []string{"inventory.>"}},
			{Stream: Orders, Durable: NotifyOrders, FilterSubjects: []string{"orders.>"}},
		},
	}
}

// Provision creates or updates every stream of t, the DLQ stream and every
// consumer. It is idempotent: running it again with the same topology
// changes nothing.
func Provision(ctx context.Context, js jetstream.JetStream, t Topology) error {
	cfg := t.Config
	streams := append([]Stream{{
		Name:     DLQ,
		Subjects: []string{DLQSubjectPrefix + ">"},
		MaxAge:   cmp.Or(cfg.DLQMaxAge, defaultDLQMaxAge),
	}}, t.Streams...)
	for _, s := range streams {
		if err := provisionStream(ctx, js, jetstream.StreamConfig{
			Name:       s.Name,
			Subjects:   s.Subjects,
			Storage:    cmp.Or(cfg.Storage, defaultStorageType),
			Replicas:   cmp.Or(cfg.Replicas, defaultReplicas),
			Duplicates: cmp.Or(cfg.DuplicateWindow, defaultDupWindow),
			MaxAge:     cmp.Or(s.MaxAge, cfg.MaxAge, defaultMaxAge),
			Retention:  jetstream.LimitsPolicy,
			Discard:    jetstream.DiscardOld,
			// The outbox relays publish large batches atomically: one
			// fsync per batch under sync_interval: always (nats-server
			// 2.12+).
			AllowAtomicPublish: true,
		}); err != nil {
			return fmt.Errorf("provision stream %s: %w", s.Name, err)
		}
	}
	for _, c := range t.Consumers {
		cc := jetstream.ConsumerConfig{
			Durable:       c.Durable,
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       cmp.Or(c.AckWait, defaultAckWait),
			BackOff:       c.BackOff,
			MaxDeliver:    cmp.Or(c.MaxDeliver, defaultMaxDeliver),
			MaxAckPending: cmp.Or(c.MaxAckPending, defaultMaxAckPend),
			Replicas:      cmp.Or(cfg.Replicas, defaultReplicas),
		}
		if len(c.FilterSubjects) == 1 {
			cc.FilterSubject = c.FilterSubjects[0]
		} else {
			cc.FilterSubjects = c.FilterSubjects
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cc); err != nil {
			return fmt.Errorf("provision consumer %s on %s: %w", c.Durable, c.Stream, err)
		}
	}
	return nil
}

// provisionStream creates the stream, or updates it only when its
// configuration differs. Every service provisions at start-up, often at the
// same moment; an update that changes nothing would still race with another
// service creating its consumers on the stream (nats-server 2.15 reads the
// stream config unlocked there, which the race detector reports).
func provisionStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	s, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		// A concurrent creator may win; creating an identical stream again
		// succeeds.
		_, err = js.CreateStream(ctx, cfg)
		return err
	case err != nil:
		return err
	}
	have := s.CachedInfo().Config
	if slices.Equal(have.Subjects, cfg.Subjects) && have.Storage == cfg.Storage &&
		have.Replicas == cfg.Replicas && have.Duplicates == cfg.Duplicates &&
		have.MaxAge == cfg.MaxAge && have.Retention == cfg.Retention && have.Discard == cfg.Discard &&
		have.AllowAtomicPublish == cfg.AllowAtomicPublish {
		return nil
	}
	_, err = js.UpdateStream(ctx, cfg)
	return err
}
