package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/audit/internal/inventorydb"
	"github.com/onceflow/onceflow/internal/audit/internal/notifydb"
	"github.com/onceflow/onceflow/internal/audit/internal/orderdb"
	"github.com/onceflow/onceflow/internal/audit/internal/paymentdb"
	"github.com/onceflow/onceflow/internal/audit/internal/platformdb"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

const (
	// maxUnsentListed is how many unsent outbox rows per database are named.
	maxUnsentListed = 20
	// maxDLQScanned bounds the DLQ messages read for their reasons; the
	// counts per consumer are exact whatever the size of the DLQ.
	maxDLQScanned = 10_000
)

// snapshot is everything the checks look at, read once after the wait. Each
// database is read in one repeatable-read transaction, so the facts of one
// database are consistent with each other.
type snapshot struct {
	orders      []order // by id
	lateReplies []lateReply
	// readAt is when the orders were read; expiryGrace how long past its
	// deadline an order may still be open (the expirer's round, a restart).
	readAt       time.Time
	expiryGrace  time.Duration
	payments     []payment
	wallets      []wallet
	stock        []stockLevel
	reservations []reservation
	// strayLines are reservation lines of orders without a reservation:
	// no foreign key keeps them out (see inventory's migration 00002).
	strayLines    map[uuid.UUID]map[string]int64
	notifications []notification
	outboxes      []outboxState // order, payment, inventory, notify
	consumers     []consumerState
	// events are the distinct event ids of each type on the saga's
	// streams, per order (see orderEvents); nil when a stream was too large
	// to read.
	events map[uuid.UUID]map[event.Type][]uuid.UUID
	// dlqElsewhere counts DLQ entries of durables outside the topology.
	dlqElsewhere map[string]uint64
}

type order struct {
	id         uuid.UUID
	customerID string
	status     string
	totalCents int64
	lines      map[string]int64 // quantity per SKU
	deadline   *time.Time       // none for orders placed before deadlines
}

// lateReply is a timeline entry of a reply that found its order terminal.
type lateReply struct {
	orderID, eventID uuid.UUID
	eventType        event.Type
	fate             string
}

type payment struct {
	orderID     uuid.UUID
	customerID  string
	amountCents int64
	status      string
}

type wallet struct {
	customerID    string
	balanceCents  int64
	creditedCents int64
}

type stockLevel struct {
	sku       string
	available int64
	// ledger is the sum of the SKU's stock movements: what was received,
	// adjusted and counted.
	ledger int64
}

type reservation struct {
	orderID uuid.UUID
	status  string
	lines   map[string]int64 // quantity per SKU
}

type notification struct {
	id        int64
	orderID   uuid.UUID
	kind      string
	status    string
	lastError string
}

type outboxState struct {
	service       string
	total, unsent int64
	oldestUnsent  []platformdb.ListUnsentRow
}

// consumerState is one durable of the topology as the broker and the
// databases know it.
type consumerState struct {
	spec          streams.Consumer
	streamMissing bool
	info          *jetstream.ConsumerInfo // nil: the consumer does not exist
	filters       []string
	// lastSeq is the stream sequence of the last message matching the
	// filters; messages is how many matching messages the stream holds.
	lastSeq, messages uint64
	// processed is the consumer's processed_events rows, in whichever
	// database holds them.
	processed int64
	dlq       uint64         // entries on its DLQ subject
	reasons   map[string]int // of the DLQ entries, per reason; nil if not read
	// scanned says whether its acked messages were verified one by one
	// (the stream and the DLQ were small enough to read); verified counts
	// the events with an inbox row or a DLQ entry (a replayed event once),
	// lost the messages with neither; replays counts the replays from the
	// DLQ among the messages.
	scanned  bool
	verified int
	replays  int
	lost     []streamMsg
}

func (s *system) snapshot(ctx context.Context) (*snapshot, error) {
	snap := &snapshot{}
	processed := make(map[string]int64)
	for _, db := range s.databases() {
		err := readOnly(ctx, db.pool, func(tx pgx.Tx) error {
			if err := s.readPlatform(ctx, tx, db.service, snap, processed); err != nil {
				return err
			}
			switch db.service {
			case serviceOrder:
				return readOrders(ctx, tx, snap)
			case servicePayment:
				return readPayments(ctx, tx, snap)
			case serviceInventory:
				return readInventory(ctx, tx, snap)
			case serviceNotify:
				return readNotifications(ctx, tx, snap)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("audit: read %s database: %w", db.service, err)
		}
	}
	if err := s.readConsumers(ctx, snap, processed); err != nil {
		return nil, err
	}
	return snap, nil
}

// readOnly runs f in a read-only repeatable-read transaction: one snapshot
// of the database.
func readOnly(ctx context.Context, pool *pgxpool.Pool, f func(pgx.Tx) error) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	// Nothing was written: rolling back ends the snapshot, and its error
	// changes nothing.
	defer func() { _ = tx.Rollback(ctx) }()
	return f(tx)
}

func (s *system) readPlatform(ctx context.Context, tx pgx.Tx, service string, snap *snapshot, processed map[string]int64) error {
	q := platformdb.New()
	stats, err := q.OutboxStats(ctx, tx)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	ob := outboxState{service: service, total: stats.Total, unsent: stats.Unsent}
	if ob.unsent > 0 {
		if ob.oldestUnsent, err = q.ListUnsent(ctx, tx, maxUnsentListed); err != nil {
			return fmt.Errorf("unsent outbox rows: %w", err)
		}
	}
	snap.outboxes = append(snap.outboxes, ob)
	counts, err := q.CountProcessed(ctx, tx)
	if err != nil {
		return fmt.Errorf("processed events: %w", err)
	}
	for _, c := range counts {
		processed[c.Consumer] += c.Events
	}
	return nil
}

func readOrders(ctx context.Context, tx pgx.Tx, snap *snapshot) error {
	q := orderdb.New()
	rows, err := q.ListOrders(ctx, tx)
	if err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	lines, err := q.ListOrderLines(ctx, tx)
	if err != nil {
		return fmt.Errorf("order lines: %w", err)
	}
	byOrder := make(map[uuid.UUID]map[string]int64, len(rows))
	for _, l := range lines {
		if byOrder[l.OrderID] == nil {
			byOrder[l.OrderID] = make(map[string]int64)
		}
		byOrder[l.OrderID][l.Sku] += int64(l.Quantity)
	}
	snap.orders = make([]order, len(rows))
	for i, r := range rows {
		snap.orders[i] = order{id: r.ID, customerID: r.CustomerID, status: r.Status, totalCents: r.TotalCents, lines: byOrder[r.ID], deadline: r.Deadline}
	}
	late, err := q.ListLateReplies(ctx, tx)
	if err != nil {
		return fmt.Errorf("late replies: %w", err)
	}
	snap.lateReplies = make([]lateReply, len(late))
	for i, l := range late {
		snap.lateReplies[i] = lateReply{orderID: l.OrderID, eventID: l.EventID, eventType: event.Type(l.EventType), fate: l.Late}
	}
	snap.readAt = time.Now()
	return nil
}

func readPayments(ctx context.Context, tx pgx.Tx, snap *snapshot) error {
	q := paymentdb.New()
	payments, err := q.ListPayments(ctx, tx)
	if err != nil {
		return fmt.Errorf("payments: %w", err)
	}
	wallets, err := q.ListWallets(ctx, tx)
	if err != nil {
		return fmt.Errorf("wallets: %w", err)
	}
	snap.payments = make([]payment, len(payments))
	for i, p := range payments {
		snap.payments[i] = payment{orderID: p.OrderID, customerID: p.CustomerID, amountCents: p.AmountCents, status: p.Status}
	}
	snap.wallets = make([]wallet, len(wallets))
	for i, w := range wallets {
		snap.wallets[i] = wallet{customerID: w.CustomerID, balanceCents: w.BalanceCents, creditedCents: w.CreditedCents}
	}
	return nil
}

func readInventory(ctx context.Context, tx pgx.Tx, snap *snapshot) error {
	q := inventorydb.New()
	stock, err := q.ListStock(ctx, tx)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	reservations, err := q.ListReservations(ctx, tx)
	if err != nil {
		return fmt.Errorf("reservations: %w", err)
	}
	lines, err := q.ListReservationLines(ctx, tx)
	if err != nil {
		return fmt.Errorf("reservation lines: %w", err)
	}
	snap.stock = make([]stockLevel, len(stock))
	for i, s := range stock {
		snap.stock[i] = stockLevel{sku: s.Sku, available: s.Available, ledger: s.Ledger}
	}
	byOrder := make(map[uuid.UUID]map[string]int64, len(reservations))
	for _, l := range lines {
		if byOrder[l.OrderID] == nil {
			byOrder[l.OrderID] = make(map[string]int64)
		}
		byOrder[l.OrderID][l.Sku] += l.Quantity
	}
	snap.reservations = make([]reservation, len(reservations))
	for i, r := range reservations {
		snap.reservations[i] = reservation{orderID: r.OrderID, status: r.Status, lines: byOrder[r.OrderID]}
		delete(byOrder, r.OrderID)
	}
	snap.strayLines = byOrder
	return nil
}

func readNotifications(ctx context.Context, tx pgx.Tx, snap *snapshot) error {
	rows, err := notifydb.New().ListNotifications(ctx, tx)
	if err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	snap.notifications = make([]notification, len(rows))
	for i, r := range rows {
		snap.notifications[i] = notification{id: r.ID, orderID: r.OrderID, kind: r.Kind, status: r.Status, lastError: r.LastError}
	}
	return nil
}

// readConsumers reads the state of every durable of the topology, the
// messages its filters match, and the DLQ.
func (s *system) readConsumers(ctx context.Context, snap *snapshot, processed map[string]int64) error {
	// Consumers first: what a consumer acked had committed its inbox row
	// and published its DLQ entry before, so both are found when read after.
	var states []consumerState
	for _, c := range s.topology.Consumers {
		cs, err := s.readConsumer(ctx, c, processed[c.Durable])
		if err != nil {
			return err
		}
		states = append(states, cs)
	}

	dlq, err := s.readDLQ(ctx)
	if err != nil {
		return err
	}
	msgs, err := s.readMessages(ctx)
	if err != nil {
		return err
	}
	snap.events = orderEvents(msgs)
	for _, cs := range states {
		subject := streams.DLQSubjectPrefix + cs.spec.Durable
		cs.dlq, cs.reasons = dlq.counts[subject], dlq.reasons[cs.spec.Durable]
		delete(dlq.counts, subject)
		list, read := msgs[cs.spec.Stream]
		if cs.info != nil && read && dlq.letters != nil {
			cs.scanned = true
			if cs.lost, cs.verified, cs.replays, err = s.unprocessed(ctx, cs, list, dlq.letters); err != nil {
				return err
			}
		}
		snap.consumers = append(snap.consumers, cs)
	}
	snap.dlqElsewhere = byDurable(dlq.counts)
	return nil
}

// readConsumer reads the state of durable c, which has processed events
// in its inbox, and counts the messages its filters match.
func (s *system) readConsumer(ctx context.Context, c streams.Consumer, processed int64) (consumerState, error) {
	cs := consumerState{spec: c, processed: processed}
	st, err := s.js.Stream(ctx, c.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		cs.streamMissing = true
		return cs, nil
	}
	if err != nil {
		return cs, fmt.Errorf("audit: stream %s: %w", c.Stream, err)
	}
	if cs.info, err = s.consumerInfo(ctx, c); err != nil {
		return cs, err
	}
	// The filters the server applies, which are what counts; the
	// topology's when the consumer is missing.
	cs.filters = c.FilterSubjects
	if cs.info != nil {
		cs.filters = cs.info.Config.FilterSubjects
		if f := cs.info.Config.FilterSubject; f != "" {
			cs.filters = []string{f}
		}
	}
	if len(cs.filters) == 0 {
		cs.filters = []string{">"}
	}
	for _, f := range cs.filters {
		last, err := st.GetLastMsgForSubject(ctx, f)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return cs, fmt.Errorf("audit: last message on %s of %s: %w", f, c.Stream, err)
		default:
			cs.lastSeq = max(cs.lastSeq, last.Sequence)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return cs, fmt.Errorf("audit: messages on %s of %s: %w", f, c.Stream, err)
		}
		for _, n := range info.State.Subjects {
			cs.messages += n
		}
	}
	return cs, nil
}

// byDurable returns the DLQ entries per subject ("dlq.<durable>") per
// durable; nil when there are none.
func byDurable(counts map[string]uint64) map[string]uint64 {
	if len(counts) == 0 {
		return nil
	}
	durables := make(map[string]uint64, len(counts))
	for subject, n := range counts {
		durables[strings.TrimPrefix(subject, streams.DLQSubjectPrefix)] = n
	}
	return durables
}
