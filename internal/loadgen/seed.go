package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
)

// Seeded amounts. A rich customer can pay for every order of any run; a
// poor one for about three average orders. A plentiful SKU never runs out;
// a scarce one after a few orders.
const (
	richCents   = 1_000_000_000_00
	poorCents   = 6_000
	plentyStock = 1_000_000_000
	scarceStock = 10
)

// world is what a run seeded.
type world struct {
	rich, poor     []string // customer ids
	plenty, scarce []string // SKUs
}

// seed credits the run's customers and stocks its SKUs.
func seed(ctx context.Context, c *client, cfg Config) (*world, error) {
	w := &world{}
	nPoor := max(cfg.Customers/10, 1)
	for i := range cfg.Customers {
		id := fmt.Sprintf("lg-%s-c%03d", cfg.RunID, i)
		cents := int64(richCents)
		if i < nPoor {
			cents = poorCents
			w.poor = append(w.poor, id)
		} else {
			w.rich = append(w.rich, id)
		}
		u := cfg.PaymentURL + "/wallets/" + url.PathEscape(id) + "/credits"
		key := "lg-" + cfg.RunID + "-credit-" + id
		err := retry(ctx, func() {}, func() error {
			return c.do(ctx, operator, "POST", u, key, map[string]int64{"amount_cents": cents}, nil)
		})
		if err != nil {
			return nil, fmt.Errorf("seed: credit wallet %s: %w", id, err)
		}
	}
	nScarce := max(cfg.SKUs/10, 1)
	for i := range cfg.SKUs {
		sku := fmt.Sprintf("lg-%s-s%03d", cfg.RunID, i)
		stock := int64(plentyStock)
		if i < nScarce {
			stock = scarceStock
			w.scarce = append(w.scarce, sku)
		} else {
			w.plenty = append(w.plenty, sku)
		}
		if err := seedSKU(ctx, c, cfg, sku, stock, 100+rand.Int64N(1900)); err != nil {
			return nil, err
		}
	}
	if len(w.rich) == 0 || len(w.plenty) == 0 {
		return nil, fmt.Errorf("seed: %d customers and %d SKUs leave none rich or plentiful; use at least 2 of each", cfg.Customers, cfg.SKUs)
	}
	return w, nil
}

// seedSKU receives stock of sku and prices it in the order service's
// catalog.
func seedSKU(ctx context.Context, c *client, cfg Config, sku string, stock, priceCents int64) error {
	u := cfg.InventoryURL + "/stock/" + url.PathEscape(sku) + "/receipts"
	key := "lg-" + cfg.RunID + "-receipt-" + sku
	err := retry(ctx, func() {}, func() error {
		return c.do(ctx, operator, "POST", u, key, map[string]int64{"quantity": stock}, nil)
	})
	if err != nil {
		return fmt.Errorf("seed: stock %s: %w", sku, err)
	}
	u = cfg.OrderURL + "/products/" + url.PathEscape(sku)
	err = retry(ctx, func() {}, func() error {
		return c.do(ctx, operator, "PUT", u, "", map[string]int64{"unit_price_cents": priceCents}, nil)
	})
	if err != nil {
		return fmt.Errorf("seed: price %s: %w", sku, err)
	}
	return nil
}

// orderRequest is the body of POST /orders, sent as CustomerID: the order
// service takes the customer from the token.
type orderRequest struct {
	CustomerID    string      `json:"-"`
	CustomerEmail string      `json:"customer_email"`
	Items         []orderItem `json:"items"`
}

type orderItem struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// newOrder is a random order: one to three lines of one to three units,
// from a poor customer with probability poorShare and with a scarce SKU
// with probability scarceShare.
func (w *world) newOrder(rng *rand.Rand, poorShare, scarceShare float64) orderRequest {
	customers := w.rich
	if len(w.poor) > 0 && rng.Float64() < poorShare {
		customers = w.poor
	}
	customer := customers[rng.IntN(len(customers))]
	n := 1 + rng.IntN(min(3, len(w.plenty)))
	skus := make([]string, 0, n)
	if len(w.scarce) > 0 && rng.Float64() < scarceShare {
		skus = append(skus, w.scarce[rng.IntN(len(w.scarce))])
	}
	for _, i := range rng.Perm(len(w.plenty)) {
		if len(skus) == n {
			break
		}
		skus = append(skus, w.plenty[i])
	}
	req := orderRequest{CustomerID: customer, CustomerEmail: email(customer)}
	for _, sku := range skus {
		req.Items = append(req.Items, orderItem{SKU: sku, Quantity: 1 + rng.IntN(3)})
	}
	return req
}
