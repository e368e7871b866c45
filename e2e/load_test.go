package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/auth"
)

// workload is what the load asks for: wallets credited, SKUs stocked, and
// orders placed with mixed outcomes — most confirmed, some rejected for
// funds (poor customers), some cancelled for stock (scarce and unknown SKUs).
type workload struct {
	customers []customer
	skus      []stockLevel
	// scarce SKUs sell out early; unknownSKU is never stocked.
	scarce     []string
	unknownSKU string
	// orders is how many orders the load places at least; workers place them
	// concurrently.
	orders  int
	workers int
}

type customer struct {
	id, email string
	poor      bool
	credits   []int64
}

type stockLevel struct {
	sku   string
	stock int64
}

// newWorkload returns the standard workload of n orders.
func newWorkload(n int) workload {
	w := workload{orders: n, workers: 8, unknownSKU: "sku-unknown"}
	for i := range 12 {
		c := customer{id: fmt.Sprintf("rich-%02d", i), credits: []int64{400_000, 200_000}}
		if i%2 == 0 {
			c.email = c.id + "@example.test"
		}
		w.customers = append(w.customers, c)
	}
	for i := range 6 {
		w.customers = append(w.customers, customer{id: fmt.Sprintf("poor-%02d", i), poor: true, credits: []int64{2_500}})
	}
	for i := range 16 {
		w.skus = append(w.skus, stockLevel{sku: fmt.Sprintf("sku-%02d", i), stock: 1_000_000})
	}
	for i := range 3 {
		sku := fmt.Sprintf("scarce-%d", i)
		w.scarce = append(w.scarce, sku)
		w.skus = append(w.skus, stockLevel{sku: sku, stock: 6})
	}
	return w
}

// orderRequest is the body of POST /orders, sent as CustomerID (the order
// service takes the customer from the token).
type orderRequest struct {
	CustomerID    string      `json:"-"`
	CustomerEmail string      `json:"customer_email,omitempty"`
	Items         []orderItem `json:"items"`
}

type orderItem struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// order returns the i-th order of the workload: the same every time.
func (w workload) order(seed uint64, i int) orderRequest {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	var c customer
	rich, poor := w.customers[:0:0], w.customers[:0:0]
	for _, c := range w.customers {
		if c.poor {
			poor = append(poor, c)
		} else {
			rich = append(rich, c)
		}
	}
	if rng.IntN(100) < 25 {
		c = poor[rng.IntN(len(poor))]
	} else {
		c = rich[rng.IntN(len(rich))]
	}
	req := orderRequest{CustomerID: c.id, CustomerEmail: c.email}
	used := map[string]bool{}
	add := func(sku string) {
		if !used[sku] {
			used[sku] = true
			req.Items = append(req.Items, orderItem{SKU: sku, Quantity: 1 + rng.Int64N(3)})
		}
	}
	for range 1 + rng.IntN(3) {
		add(fmt.Sprintf("sku-%02d", rng.IntN(16)))
	}
	switch r := rng.IntN(100); {
	case r < 10:
		add(w.scarce[rng.IntN(len(w.scarce))])
	case r < 12:
		add(w.unknownSKU)
	}
	return req
}

// driver drives a workload through the HTTP APIs and records what it asked
// for and what it was told: the client's side of the audit.
type driver struct {
	sys    *system
	w      workload
	c      *client
	seed   uint64
	prefix string
	// repeat re-sends every successful POST once more with the same key and
	// body, expecting the stored answer back.
	repeat bool

	// loadTime is how long run took.
	loadTime time.Duration

	next    atomic.Int64 // the next order index
	replays atomic.Int64 // answers with Idempotent-Replayed: true

	mu       sync.Mutex
	placed   map[string]uuid.UUID // order id by Idempotency-Key
	keyOf    map[uuid.UUID]string // the key of each order id
	credited map[string]int64     // credits per customer that the API accepted
	credits  map[string]int       // their number
	stock    map[string]int64     // the stock each SKU received
	tokens   map[string]string    // a token per customer, made once
}

func newDriver(sys *system, w workload) *driver {
	d := &driver{
		sys:      sys,
		w:        w,
		c:        newClient(sys.token(auth.TokenRequest{Subject: "e2e-operator", Admin: true})),
		seed:     rand.Uint64(),
		prefix:   uuid.NewString()[:8],
		placed:   map[string]uuid.UUID{},
		keyOf:    map[uuid.UUID]string{},
		credited: map[string]int64{},
		credits:  map[string]int{},
		stock:    map[string]int64{},
		tokens:   map[string]string{},
	}
	sys.t.Cleanup(d.c.close)
	return d
}

// seedData credits the wallets and stocks the SKUs.
func (d *driver) seedData(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(d.w.workers)
	n := 0
	for _, c := range d.w.customers {
		for i, amount := range c.credits {
			// Spread over the payment replicas, if any.
			instance := n
			n++
			g.Go(func() error {
				return d.credit(ctx, instance, c.id, amount, fmt.Sprintf("%s-credit-%s-%d", d.prefix, c.id, i))
			})
		}
	}
	for _, s := range d.w.skus {
		g.Go(func() error { return d.setStock(ctx, s.sku, s.stock) })
	}
	// Every SKU is in the catalog, the one inventory never stocks too:
	// its orders are placed and then cancelled for stock.
	for i, s := range append(d.w.skus, stockLevel{sku: d.w.unknownSKU}) {
		g.Go(func() error { return d.setPrice(ctx, s.sku, int64(100+i*137%1100)) })
	}
	return g.Wait()
}

// setPrice puts sku in the order service's catalog at cents.
func (d *driver) setPrice(ctx context.Context, sku string, cents int64) error {
	u := d.sys.url("order") + "/products/" + url.PathEscape(sku)
	return d.send(ctx, http.MethodPut, u, "", fmt.Appendf(nil, `{"unit_price_cents":%d}`, cents), http.StatusOK, nil)
}

// credit credits a wallet through the instance-th payment instance (modulo
// their number) and records it.
func (d *driver) credit(ctx context.Context, instance int, customerID string, amount int64, key string) error {
	payments := d.sys.instances("payment")
	u := payments[instance%len(payments)].url() + "/wallets/" + url.PathEscape(customerID) + "/credits"
	if err := d.send(ctx, http.MethodPost, u, key, fmt.Appendf(nil, `{"amount_cents":%d}`, amount), http.StatusOK, nil); err != nil {
		return err
	}
	d.mu.Lock()
	d.credited[customerID] += amount
	d.credits[customerID]++
	d.mu.Unlock()
	return nil
}

// setStock stocks a new SKU at level with a receipt, and records it.
func (d *driver) setStock(ctx context.Context, sku string, level int64) error {
	u := d.sys.url("inventory") + "/stock/" + url.PathEscape(sku) + "/receipts"
	key := fmt.Sprintf("%s-receipt-%s", d.prefix, sku)
	if err := d.send(ctx, http.MethodPost, u, key, fmt.Appendf(nil, `{"quantity":%d}`, level), http.StatusOK, nil); err != nil {
		return err
	}
	d.mu.Lock()
	d.stock[sku] += level
	d.mu.Unlock()
	return nil
}

// placeNext places the next order of the workload.
func (d *driver) placeNext(ctx context.Context) error {
	return d.place(ctx, int(d.next.Add(1))-1)
}

// as is the header of a request by customer: their token.
func (d *driver) as(customer string) http.Header {
	d.mu.Lock()
	defer d.mu.Unlock()
	tok, ok := d.tokens[customer]
	if !ok {
		// A token that cannot be signed is sent empty: the 401 says so.
		// With their e-mail, the only address their orders may name.
		tok, _ = d.sys.issuer.Token(auth.TokenRequest{Subject: customer, Email: customer + "@example.test"})
		d.tokens[customer] = tok
	}
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// send sends a request through the retrying client and fails unless the
// final answer has status want. With repeat set, a successful POST is sent
// again and must be replayed with the same body. Headers in extra are set
// last (as, for a customer's request); without, the operator sends it.
func (d *driver) send(ctx context.Context, method, u, key string, body []byte, want int, out any, extra ...http.Header) error {
	resp, err := d.c.do(ctx, method, u, key, body, extra...)
	if err != nil {
		return err
	}
	if resp.status != want {
		return fmt.Errorf("%s %s (key %q): %s, want %d", method, u, key, resp, want)
	}
	if resp.replayed() {
		d.replays.Add(1)
	}
	if d.repeat && method == http.MethodPost {
		again, err := d.c.do(ctx, method, u, key, body, extra...)
		if err != nil {
			return err
		}
		if again.status != want || !again.replayed() || string(again.body) != string(resp.body) {
			return fmt.Errorf("%s %s (key %q) again: %s (replayed %v), want the stored %s", method, u, key, again, again.replayed(), resp)
		}
		d.replays.Add(1)
	}
	if out != nil {
		if err := json.Unmarshal(resp.body, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, u, err)
		}
	}
	return nil
}

// place places order i.
func (d *driver) place(ctx context.Context, i int) error {
	req := d.w.order(d.seed, i)
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	key := fmt.Sprintf("%s-order-%d", d.prefix, i)
	var o struct {
		ID uuid.UUID `json:"id"`
	}
	if err := d.send(ctx, http.MethodPost, d.sys.url("order")+"/orders", key, body, http.StatusCreated, &o, d.as(req.CustomerID)); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if other, ok := d.keyOf[o.ID]; ok && other != key {
		return fmt.Errorf("order %s was answered for two keys, %s and %s", o.ID, other, key)
	}
	d.placed[key], d.keyOf[o.ID] = o.ID, key
	return nil
}

// run places w.orders orders while during runs and, if during has not
// returned by then, goes on placing orders at a slower pace until it does
// (at most five times as many), so that a fault schedule always meets load.
// It returns during's error.
func (d *driver) run(ctx context.Context, during func(ctx context.Context) error) error {
	if during == nil {
		during = func(context.Context) error { return nil }
	}
	start := time.Now()
	defer func() { d.loadTime = time.Since(start) }()
	faultDone := make(chan struct{})
	var faultErr error
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	go func() {
		defer close(faultDone)
		faultErr = during(loadCtx)
	}()

	g, gctx := errgroup.WithContext(loadCtx)
	for range d.w.workers {
		g.Go(func() error {
			for {
				i := int(d.next.Add(1)) - 1
				if i >= d.w.orders {
					// Past the workload, the load goes on at a slower pace
					// until the fault schedule ends.
					select {
					case <-faultDone:
						return nil
					case <-time.After(250 * time.Millisecond):
					}
					if i >= 5*d.w.orders {
						<-faultDone
						return nil
					}
				}
				if err := d.sys.problems(); err != nil {
					return err
				}
				if err := d.place(gctx, i); err != nil {
					return err
				}
			}
		})
	}
	err := g.Wait()
	if err != nil {
		stopLoad()
	}
	<-faultDone
	if err != nil {
		// Both: a fault that failed often makes the load give up too.
		return errors.Join(fmt.Errorf("load: %w", err), faultErr)
	}
	return faultErr
}

// placedOrders returns a copy of the orders placed so far.
func (d *driver) placedOrders() map[string]uuid.UUID {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := make(map[string]uuid.UUID, len(d.placed))
	for k, v := range d.placed {
		m[k] = v
	}
	return m
}

// awaitOrders waits until at least n orders are placed, for fault schedules
// that need load first.
func (d *driver) awaitOrders(ctx context.Context, n int) error {
	for {
		d.mu.Lock()
		got := len(d.placed)
		d.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d orders (%d placed): %w", n, got, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
