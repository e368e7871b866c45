package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/httpapi"
)

// abuse is one hostile request and the status it must get.
type abuse struct {
	name    string
	kind    string // the service
	method  string
	path    string
	key     string // Idempotency-Key
	ctype   string // Content-Type; default application/json
	header  http.Header
	body    string
	want    int
	anyFour bool // any 4xx will do
}

// validOrder is a well-formed order body with the given SKU quantity; the
// customer is the token's.
func validOrder(quantity int) string {
	return fmt.Sprintf(`{"items":[{"sku":"sku-00","quantity":%d}]}`, quantity)
}

func abuses(d *driver) []abuse {
	anonymous := http.Header{"Authorization": {""}}
	forged := http.Header{"Authorization": {"Bearer " + d.sys.forgedToken()}}
	customer := d.as("rich-00")
	items := make([]string, 101)
	for i := range items {
		items[i] = fmt.Sprintf(`{"sku":"s%d","quantity":1}`, i)
	}
	order := func(name, body string) abuse {
		return abuse{name: name, kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-" + uuid.NewString(), body: body, want: http.StatusBadRequest}
	}
	credit := func(name, body string) abuse {
		return abuse{name: name, kind: "payment", method: http.MethodPost, path: "/wallets/rich-00/credits", key: "abuse-" + uuid.NewString(), body: body, want: http.StatusBadRequest}
	}
	receipt := func(name, body string) abuse {
		return abuse{name: name, kind: "inventory", method: http.MethodPost, path: "/stock/sku-00/receipts", key: "abuse-" + uuid.NewString(), body: body, want: http.StatusBadRequest}
	}
	get := func(name, kind, path string, want int) abuse {
		return abuse{name: name, kind: kind, method: http.MethodGet, path: path, want: want}
	}
	cases := []abuse{
		{name: "no Idempotency-Key", kind: "order", method: http.MethodPost, path: "/orders", body: validOrder(1), want: http.StatusBadRequest},
		{name: "Idempotency-Key too long", kind: "order", method: http.MethodPost, path: "/orders", key: strings.Repeat("k", 300), body: validOrder(1), want: http.StatusBadRequest},
		{name: "Idempotency-Key not ASCII", kind: "order", method: http.MethodPost, path: "/orders", key: "cl\u00e9-\xff", body: validOrder(1), want: http.StatusBadRequest},
		{name: "not JSON", kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-ct", ctype: "text/plain", body: validOrder(1), want: http.StatusUnsupportedMediaType},
		{name: "anonymous order", kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-anon", header: anonymous, body: validOrder(1), want: http.StatusUnauthorized},
		{name: "forged token", kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-forged", header: forged, body: validOrder(1), want: http.StatusUnauthorized},
		{name: "anonymous credit", kind: "payment", method: http.MethodPost, path: "/wallets/rich-00/credits", key: "abuse-anon", header: anonymous, body: `{"amount_cents":1}`, want: http.StatusUnauthorized},
		{name: "forged credit", kind: "payment", method: http.MethodPost, path: "/wallets/rich-00/credits", key: "abuse-forged", header: forged, body: `{"amount_cents":1}`, want: http.StatusUnauthorized},
		{name: "a customer credits", kind: "payment", method: http.MethodPost, path: "/wallets/rich-00/credits", key: "abuse-self", header: customer, body: `{"amount_cents":100000000000}`, want: http.StatusForbidden},
		{name: "a customer receives stock", kind: "inventory", method: http.MethodPost, path: "/stock/sku-00/receipts", key: "abuse-self", header: customer, body: `{"quantity":1}`, want: http.StatusForbidden},
		{name: "another customer's wallet", kind: "payment", method: http.MethodGet, path: "/wallets/rich-01", header: customer, want: http.StatusNotFound},
		{name: "another customer's orders", kind: "order", method: http.MethodGet, path: "/orders?customer_id=rich-01", header: customer, want: http.StatusForbidden},
		{name: "anonymous wallet", kind: "payment", method: http.MethodGet, path: "/wallets/rich-00", header: anonymous, want: http.StatusUnauthorized},
		{name: "oversized body", kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-big",
			body: `{"customer_email":"` + strings.Repeat("a", 70<<10) + `","items":[]}`, want: http.StatusRequestEntityTooLarge},
		{name: "oversized header", kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-hdr",
			header: http.Header{"X-Junk": {strings.Repeat("j", 2<<20)}}, body: validOrder(1), want: http.StatusRequestHeaderFieldsTooLarge},
		order("truncated JSON", `{"items":[`),
		order("unknown field", `{"admin":true,"items":[{"sku":"sku-00","quantity":1}]}`),
		order("a customer_id (the token says who)", `{"customer_id":"rich-01","items":[{"sku":"sku-00","quantity":1}]}`),
		order("duplicate key", `{"items":[{"sku":"sku-00","quantity":1}],"items":[]}`),
		order("case-folded key", `{"Items":[{"sku":"sku-00","quantity":1}]}`),
		order("trailing data", validOrder(1)+`{}`),
		order("top-level array", `[]`),
		order("null", `null`),
		order("items a string", `{"items":"sku-00"}`),
		order("no items", `{"items":[]}`),
		order("101 items", `{"items":[`+strings.Join(items, ",")+`]}`),
		order("zero quantity", validOrder(0)),
		order("negative quantity", validOrder(-1)),
		order("quantity over the limit", validOrder(1_000_001)),
		order("quantity overflowing int64", `{"items":[{"sku":"sku-00","quantity":1e30}]}`),
		order("a price of the client's", `{"items":[{"sku":"sku-00","quantity":1,"unit_price_cents":0}]}`),
		order("a total overflowing int64", `{"items":[{"sku":"sku-00","quantity":1000000,"unit_price_cents":9000000000000000000}]}`),
		{name: "a SKU not in the catalog", kind: "order", method: http.MethodPost, path: "/orders", key: "abuse-kiwi", body: `{"items":[{"sku":"kiwi","quantity":1}]}`, want: http.StatusUnprocessableEntity},
		{name: "a customer sets a price", kind: "order", method: http.MethodPut, path: "/products/sku-00", header: customer, body: `{"unit_price_cents":1}`, want: http.StatusForbidden},
		order("same SKU twice", `{"items":[{"sku":"sku-00","quantity":1},{"sku":"sku-00","quantity":1}]}`),
		order("NUL in a SKU", `{"items":[{"sku":"sku\u0000","quantity":1}]}`),
		order("display-name e-mail", `{"customer_email":"Eve <eve@example.test>","items":[{"sku":"sku-00","quantity":1}]}`),
		order("not an e-mail", `{"customer_email":"eve","items":[{"sku":"sku-00","quantity":1}]}`),
		order("nesting bomb", `{"items":`+strings.Repeat("[", 20_000)+strings.Repeat("]", 20_000)+`}`),
		get("order id not a UUID", "order", "/orders/not-a-uuid", http.StatusBadRequest),
		get("unknown order", "order", "/orders/"+uuid.NewString(), http.StatusNotFound),
		get("list of a customer with a space", "order", "/orders?customer_id=rich%2000", http.StatusBadRequest),
		get("list limit 0", "order", "/orders?customer_id=rich-00&limit=0", http.StatusBadRequest),
		get("list limit too high", "order", "/orders?customer_id=rich-00&limit=100000", http.StatusBadRequest),
		get("list limit not a number", "order", "/orders?customer_id=rich-00&limit=abc", http.StatusBadRequest),
		{name: "path traversal", kind: "order", method: http.MethodGet, path: "/orders/..%2f..%2fetc%2fpasswd", anyFour: true},
		{name: "DELETE /orders", kind: "order", method: http.MethodDelete, path: "/orders", want: http.StatusMethodNotAllowed},
		credit("zero credit", `{"amount_cents":0}`),
		credit("negative credit", `{"amount_cents":-5}`),
		credit("credit over the limit", `{"amount_cents":100000000001}`),
		credit("credit as a string", `{"amount_cents":"12"}`),
		credit("credit with an unknown field", `{"amount_cents":1,"to":"eve"}`),
		credit("credit with a duplicate key", `{"amount_cents":1,"amount_cents":100000000000}`),
		credit("credit with a case-folded key", `{"AMOUNT_CENTS":7}`),
		{name: "credit without Idempotency-Key", kind: "payment", method: http.MethodPost, path: "/wallets/rich-00/credits", body: `{"amount_cents":1}`, want: http.StatusBadRequest},
		{name: "credit to a customer of 129 bytes", kind: "payment", method: http.MethodPost, path: "/wallets/" + strings.Repeat("c", 129) + "/credits", key: "abuse-long", body: `{"amount_cents":1}`, want: http.StatusBadRequest},
		get("wallet of a customer with a space", "payment", "/wallets/rich%2000", http.StatusBadRequest),
		receipt("negative receipt", `{"quantity":-1}`),
		receipt("zero receipt", `{"quantity":0}`),
		receipt("null receipt", `{"quantity":null}`),
		receipt("missing quantity", `{}`),
		receipt("receipt over the limit", `{"quantity":1000000001}`),
		receipt("receipt as a string", `{"quantity":"abc"}`),
		{name: "receipt without Idempotency-Key", kind: "inventory", method: http.MethodPost, path: "/stock/sku-00/receipts", body: `{"quantity":1}`, want: http.StatusBadRequest},
		{name: "receipt not JSON", kind: "inventory", method: http.MethodPost, path: "/stock/sku-00/receipts", key: "abuse-" + uuid.NewString(), ctype: "text/plain", body: `{"quantity":1}`, want: http.StatusUnsupportedMediaType},
		{name: "adjustment without a reason", kind: "inventory", method: http.MethodPost, path: "/stock/sku-00/adjustments", key: "abuse-" + uuid.NewString(), body: `{"delta":-1}`, want: http.StatusBadRequest},
		{name: "adjustment below zero", kind: "inventory", method: http.MethodPost, path: "/stock/sku-00/adjustments", key: "abuse-" + uuid.NewString(), body: `{"delta":-1000000000,"reason":"theft"}`, want: http.StatusConflict},
		{name: "count without If-Match", kind: "inventory", method: http.MethodPut, path: "/stock/sku-00", body: `{"available":0}`, want: http.StatusPreconditionRequired},
		{name: "count of a stale version", kind: "inventory", method: http.MethodPut, path: "/stock/sku-00", header: http.Header{"If-Match": {`"0"`}}, body: `{"available":0}`, want: http.StatusPreconditionFailed},
	}
	return cases
}

// writes counts what the table must not change.
func (sys *system) writes(ctx context.Context) (string, error) {
	queries := []struct{ kind, query string }{
		{"order", `SELECT count(*) FROM orders`},
		{"order", `SELECT count(*) FROM outbox`},
		{"order", `SELECT count(*) FROM idempotency_keys`},
		{"order", `SELECT coalesce(sum(unit_price_cents), 0)::bigint FROM products`},
		{"payment", `SELECT count(*) FROM wallet_credits`},
		{"payment", `SELECT coalesce(sum(balance_cents), 0)::bigint FROM wallets`},
		{"payment", `SELECT count(*) FROM idempotency_keys`},
		{"inventory", `SELECT coalesce(sum(available), 0)::bigint FROM stock`},
		{"inventory", `SELECT count(*) FROM stock`},
		{"inventory", `SELECT count(*) FROM stock_movements`},
		{"inventory", `SELECT count(*) FROM idempotency_keys`},
	}
	var parts []string
	for _, q := range queries {
		var n int64
		if err := sys.pools[q.kind].QueryRow(ctx, q.query).Scan(&n); err != nil {
			return "", fmt.Errorf("%s: %w", q.query, err)
		}
		parts = append(parts, fmt.Sprintf("%s: %s = %d", q.kind, q.query, n))
	}
	return strings.Join(parts, "\n"), nil
}

// TestHTTPAbuse sends a table of malformed, oversized and hostile requests,
// which must all be refused with a 4xx problem and write nothing, then 100
// concurrent requests with one Idempotency-Key — most with one body, some
// with another — which must create one order, every other answer being a
// replay of it, a 409 or (for the other body) a 422; then a normal load.
func TestHTTPAbuse(t *testing.T) {
	t.Parallel()
	sys, d := scenario(t, deployment{}, scaled(100))
	ctx := t.Context()
	before, err := sys.writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range abuses(d) {
		resp, err := d.c.once(ctx, a.method, sys.url(a.kind)+a.path, a.key, a.bodyFor(), a.headers()...)
		switch {
		case err != nil:
			t.Errorf("e2e: %s: %v", a.name, err)
		case a.anyFour && (resp.status < 400 || resp.status > 499):
			t.Errorf("e2e: %s: %s, want a 4xx", a.name, resp)
		case !a.anyFour && resp.status != a.want:
			t.Errorf("e2e: %s: %s, want %d", a.name, resp, a.want)
		case resp.status != http.StatusRequestHeaderFieldsTooLarge && resp.header.Get("Content-Type") != httpapi.ContentTypeProblem:
			// net/http itself answers an oversized header, in plain text.
			t.Errorf("e2e: %s: Content-Type %q, want %s", a.name, resp.header.Get("Content-Type"), httpapi.ContentTypeProblem)
		}
	}
	sys.faults.add("hostile_requests", int64(len(abuses(d))))
	after, err := sys.writes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("e2e: the hostile requests wrote something:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	sys.racingRetries(d, 100)

	if err := d.run(ctx, nil); err != nil {
		t.Fatal(err)
	}
	sys.verify(d, expect{exactCounts: true})
}

func (a abuse) bodyFor() []byte {
	if a.body == "" && a.method == http.MethodGet {
		return nil
	}
	return []byte(a.body)
}

func (a abuse) headers() []http.Header {
	h := http.Header{}
	for k, v := range a.header {
		h[k] = v
	}
	if a.ctype != "" {
		h.Set("Content-Type", a.ctype)
	}
	return []http.Header{h}
}

// racingRetries sends n concurrent POST /orders with one Idempotency-Key: a
// fifth with another body. Exactly one order may come of it. Which request
// wins, and which of the others wait, replay or get a 409, is the race's;
// the checks accept every outcome of it and require only what holds in
// all: one original 201, and no answer contradicting it.
func (sys *system) racingRetries(d *driver, n int) {
	t := sys.t
	t.Helper()
	ctx := t.Context()
	key := "racing-" + uuid.NewString()
	bodies := []string{validOrder(1), validOrder(2)}
	rich := d.as("rich-01")
	type answer struct {
		body int
		resp response
		err  error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			b := 0
			if i%5 == 4 {
				b = 1
			}
			resp, err := d.c.once(ctx, http.MethodPost, sys.url("order")+"/orders", key, []byte(bodies[b]), rich)
			answers[i] = answer{b, resp, err}
		})
	}
	close(start)
	wg.Wait()
	sys.faults.add("racing_retries", int64(n))

	winner, originals := -1, 0
	var orderID uuid.UUID
	statuses := map[string]int{}
	for _, a := range answers {
		if a.err != nil {
			t.Errorf("e2e: racing retry: %v", a.err)
			continue
		}
		label := fmt.Sprint(a.resp.status)
		if a.resp.replayed() {
			label += " replayed"
		}
		statuses[label]++
		if a.resp.status == http.StatusCreated && !a.resp.replayed() {
			originals++
			winner = a.body
		}
	}
	t.Logf("racing retries of one key: %v", statuses)
	if originals != 1 {
		t.Fatalf("e2e: %d racing requests created an order, want exactly 1 (%v)", originals, statuses)
	}
	for _, a := range answers {
		switch {
		case a.err != nil:
		case a.resp.status == http.StatusCreated:
			var o struct {
				ID uuid.UUID `json:"id"`
			}
			if err := json.Unmarshal(a.resp.body, &o); err != nil {
				t.Errorf("e2e: racing retry answer %s: %v", a.resp, err)
				continue
			}
			if orderID == uuid.Nil {
				orderID = o.ID
			}
			if o.ID != orderID || a.body != winner {
				t.Errorf("e2e: racing retries answered 201 with order %s (body %d) and %s (body %d)", orderID, winner, o.ID, a.body)
			}
		case a.resp.status == http.StatusConflict:
		case a.resp.status == http.StatusUnprocessableEntity && a.body != winner:
		default:
			t.Errorf("e2e: racing retry with body %d (winner %d): %s", a.body, winner, a.resp)
		}
	}
	d.mu.Lock()
	d.placed[key], d.keyOf[orderID] = orderID, key
	d.mu.Unlock()
}
