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
//				return []conformance.Subscription{
//					{
//						Stream:  streams.Orders,
//						Durable: streams.LoyaltyOrders,
//						Handler: s.HandleOrderConfirmed,
//						// A OrderConfirmed of a new order of a customer of its own.
//						NewEvent: func(t testing.TB, _ conformance.Env) conformance.Event {
//							orderID, customer := uuid.Must(uuid.NewV7()), "c-"+uuid.NewString()
//							ev, err := event.New("order", event.OrderConfirmed, orderID.String(), event.OrderConfirmedV1{Order: event.Order{OrderID: orderID, CustomerID: customer}, TotalCents: 300})
//							require.NoError(t, err)
//							return ev
//						},
//						Effect: customerEffect,
//					},
//				}
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
//     from the pool, and the rollback left every table as it was. A write
//     elsewhere outlives a rollback and happens again at each redelivery.
//   - emits-through-the-outbox: nothing is published while the handler
//     runs, whether its transaction rolls back or commits; the relay
//     publishes each outbox row once, with the event id as its
//     Nats-Msg-Id and its stream's owner as its ce-source; a re-drive
//     publishes nothing new. A direct publish cannot be undone by a rollback.
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
//
// A failure says what to fix. The kit's own tests keep handlers broken in
// those ways beside it (broken_test.go), each failing its property.
//
// The API uses public types only: Event and Handler are aliases of the
// inbox's (event.Envelope, and the handler's func type), so a service of
// this module passes its handlers as they are and a service in another
// module can name, build and read them; pgx and jetstream are public.
// BatchHandler alone names an internal type (the write pipeline), so only
// services of this module can have their set-based handlers tested.
//
// Limits: the kit runs the handlers on this module's inbox and outbox, on
// the saga's streams (internal/streams); an event is one of the saga's
// types. A handler that writes through a pool of its own, not the one in
// Env, is seen only by what it writes; one that publishes on a subject no
// stream holds is not seen.
package conformance
