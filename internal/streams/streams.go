package streams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	// DLQActions records what operators did with DLQ entries (replays and
	// discards, who and when), on "dlqactions.<DLQ sequence>".
	DLQActions = "DLQ_ACTIONS"

	PaymentOrders     = "payment-orders"     // payment ← OrderPlaced
	PaymentInventory  = "payment-inventory"  // payment ← StockRejected
	InventoryPayments = "inventory-payments" // inventory ← PaymentDebited
	OrderPayments     = "order-payments"     // order ← PaymentDebited/Rejected/Refunded
	OrderInventory    = "order-inventory"    // order ← StockReserved/Rejected
	NotifyOrders      = "notify-orders"      // notify ← order milestones
	PaymentExpiries   = "payment-expiries"   // payment ← OrderExpired (refund)
	InventoryExpiries = "inventory-expiries" // inventory ← OrderExpired (release)

	// DLQSubjectPrefix prefixes the consumer name on dead-letter subjects.
	DLQSubjectPrefix = "dlq."
	// DLQActionsSubjectPrefix prefixes the DLQ sequence of the entry an
	// action is about.
	DLQActionsSubjectPrefix = "dlqactions."
)

// replayToken separates a replay subject's original subject from the
// durable it is replayed to.
const replayToken = ".replay."

// ReplaySubject is the subject on which a message first published on
// subject is replayed to durable alone, from the DLQ: the original subject
// with ".replay.<durable>" appended, so that it stays in the original
// stream. Every durable filters the replay subjects of its own filters (see
// Consumer.Filters) and no other durable's, as long as no filter ends in
// ">". A subject that is already a replay subject is replayed on the
// replay subject of its original.
func ReplaySubject(subject, durable string) string {
	if original, _, ok := ReplayOf(subject); ok {
		subject = original
	}
	return subject + replayToken + durable
}

// ReplayOf splits a replay subject into the original subject and the durable
// it is replayed to; ok is false for a subject that is not a replay subject.
func ReplayOf(subject string) (original, durable string, ok bool) {
	original, durable, ok = strings.Cut(subject, replayToken)
	if !ok || original == "" || durable == "" || strings.Contains(durable, ".") {
		return "", "", false
	}
	return original, durable, true
}

const (
	defaultMaxDeliver  = 10
	defaultAckWait     = 30 * time.Second
	defaultDupWindow   = 2 * time.Minute
	defaultMaxAge      = 72 * time.Hour
	defaultDLQMaxAge   = 30 * 24 * time.Hour
	defaultActionsAge  = 365 * 24 * time.Hour
	defaultMaxBytes    = 256 << 20 // per stream; the demo's store holds 1 GiB
	defaultDLQMaxBytes = 64 << 20
	defaultMaxMsgSize  = 1 << 20 // NATS's default max_payload
	// A dead letter's budget: entries per durable, and bytes per entry
	// (events here are a few KiB; the inbox drops a larger body from the
	// entry, the original keeps it).
	defaultDLQPerConsumer = 1000
	defaultDLQMaxMsgSize  = 16 << 10
	dlqEntryOverhead      = 1 << 10
	defaultMaxAckPend     = 1000
	defaultReplicas       = 1
	defaultStorageType    = jetstream.FileStorage
)

// Config is what differs between deployments, read by `onceflow provision`
// from its environment. Zero values take the defaults.
type Config struct {
	Replicas        int                   `env:"STREAM_REPLICAS"`         // default 1; 3 on a cluster
	Storage         jetstream.StorageType `env:"-"`                       // default file
	DuplicateWindow time.Duration         `env:"STREAM_DUPLICATE_WINDOW"` // default 2m; the outbox keeps sent rows at least this long
	MaxAge          time.Duration         `env:"STREAM_MAX_AGE"`          // default 72h; the inbox retention must exceed it
	DLQMaxAge       time.Duration         `env:"DLQ_MAX_AGE"`             // default 30 days
	// MaxBytes bounds each event stream (default 256 MiB) and DLQMaxBytes
	// the DLQ_ACTIONS stream (default 64 MiB): a full stream refuses
	// publishes, which the outbox relays retry, instead of filling the
	// server's store. The DLQ's bound is its durables' budgets.
	MaxBytes    int64 `env:"STREAM_MAX_BYTES"`
	DLQMaxBytes int64 `env:"DLQ_MAX_BYTES"`
	// MaxMsgSize bounds one message on every stream; default 1 MiB.
	MaxMsgSize int32 `env:"STREAM_MAX_MSG_SIZE"`
	// DLQMaxPerConsumer is each durable's budget in the DLQ: the entries
	// its subject dlq.<durable> may hold (default 1000); past it the DLQ
	// refuses that durable's dead letters (the inbox retries them) and no
	// other's. DLQMaxMsgSize bounds an entry (default 16 KiB). The DLQ's
	// MaxBytes is the sum of every durable's budget, so that no durable
	// spends another's; DLQMaxBytes, when set, bounds the DLQ_ACTIONS
	// stream only.
	DLQMaxPerConsumer int64 `env:"DLQ_MAX_PER_CONSUMER"`
	DLQMaxMsgSize     int32 `env:"DLQ_MAX_MSG_SIZE"`
	// DLQActionsMaxAge is how long the record of replays and discards is
	// kept; default a year.
	DLQActionsMaxAge time.Duration `env:"DLQ_ACTIONS_MAX_AGE"`
	// InboxRetention, when set, is recorded in the metadata of every
	// durable provisioned (MetadataInboxRetention), so that a replay from
	// the DLQ can tell whether the consumer's inbox still remembers an event.
	InboxRetention time.Duration `env:"INBOX_RETENTION" envDefault:"168h"`

	// The redelivery settings of every consumer that does not set its own:
	// AckWait (default 30s) must be longer than a handler or a batch needs,
	// on the slowest day, or its messages are redelivered while it runs
	// (harmless, the inbox drops them, but wasted work); MaxDeliver
	// (default 10) is how many deliveries run a message's handler before
	// the inbox dead-letters it (MetadataMaxDeliver); BackOff, when set, is
	// the ack wait of each delivery in turn (the server takes its first as
	// the AckWait, and its last for every delivery after).
	AckWait    time.Duration   `env:"CONSUMER_ACK_WAIT"`
	MaxDeliver int             `env:"CONSUMER_MAX_DELIVER"`
	BackOff    []time.Duration `env:"CONSUMER_BACKOFF"`
}

// MetadataInboxRetention is the consumer metadata key that holds the inbox
// retention of the service consuming it, as a Go duration.
const MetadataInboxRetention = "onceflow.inbox.retention"

// MetadataMaxDeliver is the consumer metadata key that holds the inbox's
// delivery budget (Consumer.MaxDeliver): the deliveries that run a
// message's handler; the next one dead-letters it. The durable itself is
// provisioned with an unlimited MaxDeliver: the server never gives up on a
// message, so no message leaves the durable without the inbox settling it
// (package inbox).
const MetadataMaxDeliver = "onceflow.inbox.max_deliver"

// apiTimeout bounds each JetStream API call of Provision. On a cluster a
// reply can be lost (a route reset while the meta leader answers), and a
// call waiting for it would hold the whole of a caller's deadline; the
// caller's next attempt finds what the lost call did.
const apiTimeout = 15 * time.Second

// Stream is one stream of the topology.
type Stream struct {
	Name     string
	Subjects []string
	// Owner is the service that publishes on Subjects, the only one allowed
	// to, and the ce-source of every event stored there.
	Owner    string
	MaxAge   time.Duration
	MaxBytes int64
	// MaxMsgSize, when set, bounds a message of this stream instead of
	// Config.MaxMsgSize.
	MaxMsgSize int32
	// MaxMsgsPerSubject, when set, is each subject's budget: a publish
	// past it is refused (discard new per subject), not an older message
	// dropped.
	MaxMsgsPerSubject int64
}

// Consumer is one durable pull consumer: one per (service, subscription).
type Consumer struct {
	Stream  string
	Durable string
	// Service is the service that consumes the durable, the only one
	// allowed to.
	Service string
	// FilterSubjects are the subjects of the events it consumes (all of
	// the stream's when empty). Provisioning adds their replay subjects.
	FilterSubjects []string
	// AckWait must be longer than a handler (or a batch) needs; BackOff, when
	// set, replaces it per delivery. MaxDeliver bounds the deliveries that
	// run the handler, after which the inbox dead-letters the message
	// (MetadataMaxDeliver).
	AckWait       time.Duration
	BackOff       []time.Duration
	MaxDeliver    int
	MaxAckPending int
}

// Filters are the subjects c's durable filters: its FilterSubjects and the
// replay subject of each (none for a filter ending in ">", which matches its
// replays already, and every other durable's).
func (c Consumer) Filters() []string {
	filters := slices.Clone(c.FilterSubjects)
	for _, f := range c.FilterSubjects {
		if !strings.HasSuffix(f, ">") {
			filters = append(filters, ReplaySubject(f, c.Durable))
		}
	}
	return filters
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
			{Name: Orders, Subjects: []string{"orders.>"}, Owner: "order"},
			{Name: Payments, Subjects: []string{"payments.>"}, Owner: "payment"},
			{Name: Inventory, Subjects: []string{"inventory.>"}, Owner: "inventory"},
		},
		Consumers: []Consumer{
			{Stream: Orders, Durable: PaymentOrders, Service: "payment", FilterSubjects: []string{"orders.placed.v1"}},
			{Stream: Inventory, Durable: PaymentInventory, Service: "payment", FilterSubjects: []string{"inventory.rejected.v1"}},
			{Stream: Payments, Durable: InventoryPayments, Service: "inventory", FilterSubjects: []string{"payments.debited.v1"}},
			// Every subject named, not "payments.>": a wildcard would also
			// match the other durables' replay subjects.
			{Stream: Payments, Durable: OrderPayments, Service: "order", FilterSubjects: []string{"payments.debited.v1", "payments.rejected.v1", "payments.refunded.v1"}},
			{Stream: Inventory, Durable: OrderInventory, Service: "order", FilterSubjects: []string{"inventory.reserved.v1", "inventory.rejected.v1"}},
			{Stream: Orders, Durable: NotifyOrders, Service: "notify", FilterSubjects: []string{"orders.placed.v1", "orders.confirmed.v1", "orders.rejected.v1", "orders.cancelled.v1", "orders.expired.v1"}},
			// The compensations of an expired order, on durables of their
			// own: an OrderExpired may overtake the OrderPlaced or
			// PaymentDebited it undoes, and each handler settles either
			// order (docs/saga.md).
			{Stream: Orders, Durable: PaymentExpiries, Service: "payment", FilterSubjects: []string{"orders.expired.v1"}},
			{Stream: Orders, Durable: InventoryExpiries, Service: "inventory", FilterSubjects: []string{"orders.expired.v1"}},
		},
	}
}

// Provision creates or updates every stream of t, the DLQ and DLQ actions
// streams and every consumer. It is idempotent: running it again with the same topology
// changes nothing.
func Provision(ctx context.Context, js jetstream.JetStream, t Topology) error {
	cfg := t.Config
	for _, s := range t.AllStreams() {
		if err := provisionStream(ctx, js, jetstream.StreamConfig{
			Name:       s.Name,
			Subjects:   s.Subjects,
			Storage:    cmp.Or(cfg.Storage, defaultStorageType),
			Replicas:   cmp.Or(cfg.Replicas, defaultReplicas),
			Duplicates: cmp.Or(cfg.DuplicateWindow, defaultDupWindow),
			MaxAge:     cmp.Or(s.MaxAge, cfg.MaxAge, defaultMaxAge),
			MaxBytes:   cmp.Or(s.MaxBytes, cfg.MaxBytes, defaultMaxBytes),
			MaxMsgSize: cmp.Or(s.MaxMsgSize, cfg.MaxMsgSize, defaultMaxMsgSize),
			Retention:  jetstream.LimitsPolicy,
			// A full stream refuses what comes (the outbox relays retry)
			// rather than dropping its oldest events unconsumed.
			Discard:              jetstream.DiscardNew,
			MaxMsgsPerSubject:    s.MaxMsgsPerSubject,
			DiscardNewPerSubject: s.MaxMsgsPerSubject > 0,
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
			AckWait:       cmp.Or(c.AckWait, cfg.AckWait, defaultAckWait),
			BackOff:       c.BackOff,
			// The server never gives up: the inbox does, at the budget in
			// the metadata, on a delivery it settles (MetadataMaxDeliver).
			MaxDeliver:    -1,
			MaxAckPending: cmp.Or(c.MaxAckPending, defaultMaxAckPend),
			Replicas:      cmp.Or(cfg.Replicas, defaultReplicas),
			Metadata: map[string]string{
				MetadataMaxDeliver: strconv.Itoa(cmp.Or(c.MaxDeliver, cfg.MaxDeliver, defaultMaxDeliver)),
			},
		}
		if len(cc.BackOff) == 0 {
			cc.BackOff = cfg.BackOff
		}
		if cfg.InboxRetention > 0 {
			cc.Metadata[MetadataInboxRetention] = cfg.InboxRetention.String()
		}
		if filters := c.Filters(); len(filters) == 1 {
			cc.FilterSubject = filters[0]
		} else {
			cc.FilterSubjects = filters
		}
		ctx, cancel := context.WithTimeout(ctx, apiTimeout)
		_, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cc)
		cancel()
		if err != nil {
			return fmt.Errorf("provision consumer %s on %s: %w", c.Durable, c.Stream, err)
		}
	}
	return nil
}

// AllStreams returns the DLQ and DLQ actions streams and t's streams:
// every stream Provision creates.
func (t Topology) AllStreams() []Stream {
	perConsumer := cmp.Or(t.Config.DLQMaxPerConsumer, defaultDLQPerConsumer)
	msgSize := cmp.Or(t.Config.DLQMaxMsgSize, defaultDLQMaxMsgSize)
	return append([]Stream{{
		Name:     DLQ,
		Subjects: []string{DLQSubjectPrefix + ">"},
		MaxAge:   cmp.Or(t.Config.DLQMaxAge, defaultDLQMaxAge),
		// Every durable's budget, whole, with the store's overhead per
		// message (its subject, a hash, a record header): one durable's
		// entries cannot crowd out another's.
		MaxBytes:          int64(max(len(t.Consumers), 1)) * perConsumer * (int64(msgSize) + dlqEntryOverhead),
		MaxMsgSize:        msgSize,
		MaxMsgsPerSubject: perConsumer,
	}, {
		Name:     DLQActions,
		Subjects: []string{DLQActionsSubjectPrefix + ">"},
		MaxAge:   cmp.Or(t.Config.DLQActionsMaxAge, defaultActionsAge),
		MaxBytes: cmp.Or(t.Config.DLQMaxBytes, defaultDLQMaxBytes),
	}}, t.Streams...)
}

// provisionStream creates the stream, or updates it only when its
// configuration differs. Every service provisions at start-up, often at the
// same moment; an update that changes nothing would still race with another
// service creating its consumers on the stream (nats-server 2.15 reads the
// stream config unlocked there, which the race detector reports).
func provisionStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
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
		have.MaxAge == cfg.MaxAge && have.MaxBytes == cfg.MaxBytes && have.MaxMsgSize == cfg.MaxMsgSize &&
		have.Retention == cfg.Retention && have.Discard == cfg.Discard &&
		have.MaxMsgsPerSubject == cfg.MaxMsgsPerSubject && have.DiscardNewPerSubject == cfg.DiscardNewPerSubject &&
		have.AllowAtomicPublish == cfg.AllowAtomicPublish {
		return nil
	}
	_, err = js.UpdateStream(ctx, cfg)
	return err
}
