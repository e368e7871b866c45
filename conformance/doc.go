// Package conformance proves a service's inbox handlers keep onceflow's
// exactly-once guarantees: a service's test hands it its handlers, its
// migrations and a way to count an event's effect, and it runs them on the
// real inbox and outbox, against real PostgreSQL and NATS JetStream (the
// project's test environment), reporting each property by name.
//
// The whole test of a service, as `onceflow new service` writes it (see
// docs/new-service.md): a test main,
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }
//
// (outside this module, os.Exit(conformance.Main(m)), which is the same),
// and an internal test of the service's package, so that a handler may be
// an unexported dispatcher:
//
//	func TestConformance(t *testing.T) {
//		t.Parallel()
//		migrations, err := db.Migrations(Name)
//		require.NoError(t, err)
//		conformance.Run(t, conformance.Service{
//			Name:       Name,
//			Migrations: migrations,
//			New: func(env conformance.Env) []conformance.Subscription {
//				s := New(env.Pool)
//				return conformance.Wired(s.Subscriptions(), map[string][]conformance.Test{
//					streams.LoyaltyOrders: {
//						{
//							// A OrderConfirmed of a new order of a customer of its own.
//							NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
//								orderID, customer := uuid.Must(uuid.NewV7()), "c-"+uuid.NewString()
//								ev, err := event.New("order", event.OrderConfirmed, orderID.String(), event.OrderConfirmedV1{Order: event.Order{OrderID: orderID, CustomerID: customer}, TotalCents: 300})
//								require.NoError(t, err)
//								return ev
//							},
//							Effect: customerEffect,
//						},
//					},
//				})
//			},
//		})
//	}
//
// NewEvent makes a fresh event that has an effect; Effect counts that
// effect, here the generated service's starter tally (conformance.Count
// over a query).
//
// The properties, each a subtest (subscription/property, or
// subscription/mode/property where the inbox's mode matters), each on a
// database and a NATS server of its own:
//
//   - writes-only-on-its-transaction: the handler, run in a transaction
//     that is rolled back, changed the database in it, left it open (it
//     never commits or rolls back itself), took no connection of its own
//     from the pool, and the rollback left every table as it was; so did
//     the set-based handler, on events that share their entities. A write
//     elsewhere outlives a rollback and happens again at each redelivery.
//   - emits-through-the-outbox: nothing is published while the handler
//     (or the set-based handler) runs, whether its transaction rolls back
//     or commits, on any stream or key-value bucket of the server; each
//     outbox row has an event id of its own; the relay publishes each row
//     once, with the event id as its Nats-Msg-Id and its stream's owner as
//     its ce-source; a re-drive publishes nothing new. A direct publish
//     cannot be undone by a rollback.
//   - replay: an event dead-lettered after failing at every delivery,
//     replayed from the DLQ as an operator would, is processed once; a
//     replay of a processed event is a duplicate that changes nothing.
//   - accepts-events-only-from-their-owner: an event whose ce-source is not
//     its type's owner is dead-lettered, with no effect.
//
// In each mode the service runs — the reference path (a transaction per
// message), batched, and set-based where the subscription has a
// BatchHandler:
//
//   - duplicate-in-sequence: an event delivered three times (fresh message
//     ids, past the broker's dedup) has one effect; the duplicates change
//     no table.
//   - duplicate-concurrent: six copies delivered at once to two replicas
//     of two workers each have one effect.
//   - crash-between-commit-and-ack: the consumer dies (its connection
//     closed) after the commit and before the ack; the redelivery to a new
//     consumer is a duplicate: one effect.
//   - error-retried-with-backoff: a transaction that fails twice after the
//     handler ran (as a failed commit would) is retried, with a growing
//     delay, and the third run has the effect once. A handler that keeps
//     state outside its transaction (in memory) fails here.
//   - permanent-error-to-dlq: an event whose payload does not decode is
//     dead-lettered at its first delivery, with the reason, and has no
//     effect: the handler returns Event.Decode's error (it wraps
//     ErrInvalid), never swallows it, never hides it in a transient one.
//   - batch-mates-keep-their-effect: the events delivered with a poison
//     event in one batch have their effect.
//   - panic-to-dlq: an event whose handler panics at every delivery, in a
//     batch between two good ones, is retried, then dead-lettered with the
//     panic as its reason; the consumer and the batch-mates carry on.
//   - batch-of-events-sharing-entities: several good events that share
//     their entities (NewEvents: one customer, one SKU), delivered in one
//     batch, commit with each event's effect once.
//   - concurrent-events-on-one-entity: the same events run at once on two
//     replicas, each handler call held after its first statement (or as it
//     returns) until every event's call is held or waits for a lock
//     another holds, as the kit sees in pg_locks: a read that does not
//     lock the row it then updates loses an update.
//   - statement-error-retried: one statement of each event's handler (the
//     first of the first event, the second of the second, …; savepoints
//     included) fails once inside its transaction with a serialization
//     failure: the event is retried, not dead-lettered, and applied once.
//
// After error-retried-with-backoff and the last three, the tables are
// compared, row by row and not by id, with one clean run of the same
// events (the Handler on each in order, in a transaction the kit rolls
// back, twice: the columns both runs wrote alike are compared, not a
// now() or a random id): the outbox rows and every table the handler
// writes must be what one clean run leaves, however the events were
// batched, retried or raced. Two clean runs that leave different rows
// fail at once: the handler keeps state outside its transaction.
//
// A failure says what to fix. The kit's own tests keep handlers broken in
// those ways beside it (broken_test.go), each failing its property.
//
// The API uses public types only: Event, Handler, BatchHandler and
// Pipeline are aliases of the inbox's (event.Envelope, the handlers' func
// types, the write pipeline), so a service of this module passes its
// handlers as they are and a service in another module can name, build
// and read them, set-based handlers included; pgx and jetstream are
// public.
//
// Limits: the kit runs the handlers on this module's inbox and outbox, on
// the saga's streams (internal/streams); an event is one of the saga's
// types. It is a black box: it sees the service's database and the NATS
// server, nothing else. A handler that writes through a pool of its own,
// not the one in Env, is seen only by what it writes; one that publishes
// on a subject no stream holds is not seen; an HTTP call, an e-mail or a
// file written by the handler is invisible to it, and each happens again
// at every retry and redelivery. Such an effect belongs behind an outbox
// of the service's own, as notify's mailer does: the handler writes a row
// (one per event, in its transaction, which the kit does check), and a
// sender after the commit performs it at least once, with a key derived
// from the event id (notify's Message-ID) so that the receiver can
// recognise a resend.
package conformance
