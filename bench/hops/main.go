// Command hops breaks the placed→confirmed latency of the orders of a run
// down by hop of the saga, from the times the services' databases keep: when
// each event was made (its CloudEvents time), when its relay recorded it sent,
// and when its consumer's transaction claimed it.
//
//	go run ./bench/hops -order URL -payment URL -inventory URL
//
// Every clock is the one machine's (bench/e2e.sh runs it against its own
// `onceflow dev`). A relay's "sent" is after JetStream's ack, so a consumer
// may claim an event a little before it: the hop after a relay can be
// negative, and the relay's includes that overlap.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/bench/hops/internal/hopsdb"
	"github.com/onceflow/onceflow/internal/event"
)

func main() {
	var urls databases
	flag.StringVar(&urls.order, "order", "", "the order service's database URL")
	flag.StringVar(&urls.payment, "payment", "", "the payment service's database URL")
	flag.StringVar(&urls.inventory, "inventory", "", "the inventory service's database URL")
	flag.Parse()
	if urls.order == "" || urls.payment == "" || urls.inventory == "" {
		fmt.Fprintln(os.Stderr, "hops: -order, -payment and -inventory are required")
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), urls, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "hops:", err)
		os.Exit(1)
	}
}

type databases struct{ order, payment, inventory string }

// published is an outbox row that was sent.
type published struct {
	id         uuid.UUID
	made, sent time.Time
}

// service is what one database tells: its sent events by order and type,
// and when it claimed each event it consumed.
type service struct {
	sent    map[string]map[event.Type]published // subject (order id) → type
	claimed map[uuid.UUID]time.Time
}

func load(ctx context.Context, url string) (service, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return service{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	q := hopsdb.New()
	out, err := q.PublishedEvents(ctx, conn)
	if err != nil {
		return service{}, fmt.Errorf("read outbox: %w", err)
	}
	in, err := q.ConsumedEvents(ctx, conn)
	if err != nil {
		return service{}, fmt.Errorf("read inbox: %w", err)
	}
	s := service{sent: map[string]map[event.Type]published{}, claimed: map[uuid.UUID]time.Time{}}
	for _, r := range out {
		if s.sent[r.Subject] == nil {
			s.sent[r.Subject] = map[event.Type]published{}
		}
		s.sent[r.Subject][event.Type(r.EventType)] = published{id: r.EventID, made: r.EventTime, sent: r.SentAt}
	}
	for _, r := range in {
		s.claimed[r.EventID] = r.ProcessedAt
	}
	return s, nil
}

// hops names the steps of a confirmed order, in order.
var hops = []string{
	"order relay: OrderPlaced made → sent",
	"payment claims OrderPlaced",
	"payment handler: claim → PaymentDebited made",
	"payment relay: PaymentDebited made → sent",
	"inventory claims PaymentDebited",
	"inventory handler: claim → StockReserved made",
	"inventory relay: StockReserved made → sent",
	"order claims StockReserved",
	"order handler: claim → OrderConfirmed made",
	"total: OrderPlaced made → OrderConfirmed made",
}

func run(ctx context.Context, urls databases, w io.Writer) error {
	var order, payment, inventory service
	for _, d := range []struct {
		name, url string
		into      *service
	}{{"order", urls.order, &order}, {"payment", urls.payment, &payment}, {"inventory", urls.inventory, &inventory}} {
		s, err := load(ctx, d.url)
		if err != nil {
			return fmt.Errorf("%s database: %w", d.name, err)
		}
		*d.into = s
	}

	durations := make([][]time.Duration, len(hops))
	for id, evs := range order.sent {
		placed, okP := evs[event.OrderPlaced]
		confirmed, okC := evs[event.OrderConfirmed]
		debited, okD := payment.sent[id][event.PaymentDebited]
		reserved, okR := inventory.sent[id][event.StockReserved]
		paymentClaim, ok1 := payment.claimed[placed.id]
		inventoryClaim, ok2 := inventory.claimed[debited.id]
		orderClaim, ok3 := order.claimed[reserved.id]
		if !okP || !okC || !okD || !okR || !ok1 || !ok2 || !ok3 {
			continue // not confirmed, or a step's row is gone
		}
		times := []time.Time{
			placed.made, placed.sent, paymentClaim,
			debited.made, debited.sent, inventoryClaim,
			reserved.made, reserved.sent, orderClaim,
			confirmed.made,
		}
		for i := range len(times) - 1 {
			durations[i] = append(durations[i], times[i+1].Sub(times[i]))
		}
		durations[len(hops)-1] = append(durations[len(hops)-1], confirmed.made.Sub(placed.made))
	}
	n := len(durations[0])
	if n == 0 {
		return fmt.Errorf("no confirmed order with every step recorded")
	}

	fmt.Fprintf(w, "placed→confirmed by hop, %d confirmed orders (ms)\n", n)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "hop\tp50\tp90\tp99\tmean\t")
	for i, name := range hops {
		d := durations[i]
		slices.Sort(d)
		var sum time.Duration
		for _, x := range d {
			sum += x
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name,
			ms(quantile(d, 0.50)), ms(quantile(d, 0.90)), ms(quantile(d, 0.99)), ms(sum/time.Duration(len(d))))
	}
	return tw.Flush()
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
