package dev

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/inventory"
	"github.com/onceflow/onceflow/services/order"
	"github.com/onceflow/onceflow/services/payment"
)

// Wallet is a seeded wallet.
type Wallet struct {
	CustomerID   string `json:"customer_id"`
	BalanceCents int64  `json:"balance_cents"`
}

// StockItem is a seeded stock level.
type StockItem struct {
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
}

// Product is a seeded product of the order service's catalog.
type Product struct {
	SKU            string `json:"sku"`
	Name           string `json:"name"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// Seeded is the demo data Seed wrote, as the APIs answered.
type Seeded struct {
	Wallets  []Wallet
	Stock    []StockItem
	Products []Product
}

// demoData is what Seed writes: a rich and a poor customer, and SKUs in
// stock, in short supply and sold out, so that an order can be confirmed,
// rejected for funds or cancelled for stock.
func demoData() Seeded {
	return Seeded{
		Wallets: []Wallet{
			{CustomerID: "alice", BalanceCents: 100_000},
			{CustomerID: "bob", BalanceCents: 5_000},
		},
		Stock: []StockItem{
			{SKU: "apple", Available: 100},
			{SKU: "pear", Available: 50},
			{SKU: "plum", Available: 0},
		},
		Products: []Product{
			{SKU: "apple", Name: "Apple", UnitPriceCents: 120},
			{SKU: "pear", Name: "Pear", UnitPriceCents: 1_000},
			{SKU: "plum", Name: "Plum", UnitPriceCents: 500},
		},
	}
}

// Seed credits the demo wallets, stocks the demo SKUs and prices them in
// the catalog through the HTTP APIs of e, as SeedAt, with a token of e's
// issuer.
func Seed(ctx context.Context, e *Env) (Seeded, error) {
	token, err := e.Token("dev-seed", true)
	if err != nil {
		return Seeded{}, fmt.Errorf("seed: %w", err)
	}
	return SeedAt(ctx, SeedTarget{
		OrderURL:     e.URL(order.Name),
		PaymentURL:   e.URL(payment.Name),
		InventoryURL: e.URL(inventory.Name),
		Token:        token,
	})
}

// SeedTarget is where SeedAt writes: the base URLs of the order, payment
// and inventory APIs, and an operator's token they accept.
type SeedTarget struct {
	OrderURL, PaymentURL, InventoryURL string
	Token                              string
}

// SeedAt credits the demo wallets, stocks the demo SKUs and prices them in
// the catalog through the HTTP APIs of target (`onceflow seed` runs it
// against the compose demo). Each credit and each stock receipt carries an
// Idempotency-Key derived from what it seeds, so seeding again (a dev run
// on a kept data directory, the compose job run twice) is a replay, not a
// second credit or delivery. A SKU seeded at 0 is received and then
// written off, as stock that spoiled.
func SeedAt(ctx context.Context, target SeedTarget) (Seeded, error) {
	client := newClient()
	token := target.Token
	demo := demoData()
	var seeded Seeded
	for _, w := range demo.Wallets {
		var got Wallet
		u := target.PaymentURL + "/wallets/" + url.PathEscape(w.CustomerID) + "/credits"
		body := map[string]int64{"amount_cents": w.BalanceCents}
		if err := call(ctx, client, token, http.MethodPost, u, "dev-seed-credit-"+w.CustomerID, body, &got); err != nil {
			return seeded, fmt.Errorf("seed: credit wallet %s: %w", w.CustomerID, err)
		}
		seeded.Wallets = append(seeded.Wallets, got)
	}
	for _, s := range demo.Stock {
		got, err := seedStock(ctx, client, token, target.InventoryURL+"/stock/"+url.PathEscape(s.SKU), s)
		if err != nil {
			return seeded, fmt.Errorf("seed: stock %s: %w", s.SKU, err)
		}
		seeded.Stock = append(seeded.Stock, got)
	}
	for _, p := range demo.Products {
		var got Product
		u := target.OrderURL + "/products/" + url.PathEscape(p.SKU)
		body := map[string]any{"name": p.Name, "unit_price_cents": p.UnitPriceCents}
		if err := call(ctx, client, token, http.MethodPut, u, "", body, &got); err != nil {
			return seeded, fmt.Errorf("seed: price %s: %w", p.SKU, err)
		}
		seeded.Products = append(seeded.Products, got)
	}
	return seeded, nil
}

// spoiled is what seedStock receives of a SKU seeded at 0, to write off.
const spoiled = 10

// seedStock brings a new SKU to s.Available through the stock ledger at u.
func seedStock(ctx context.Context, client *http.Client, token, u string, s StockItem) (StockItem, error) {
	var got StockItem
	received := s.Available
	if received == 0 {
		received = spoiled
	}
	body := map[string]int64{"quantity": received}
	if err := call(ctx, client, token, http.MethodPost, u+"/receipts", "dev-seed-receipt-"+s.SKU, body, &got); err != nil {
		return got, err
	}
	if received == s.Available {
		return got, nil
	}
	adjustment := map[string]any{"delta": s.Available - received, "reason": "spoiled"}
	err := call(ctx, client, token, http.MethodPost, u+"/adjustments", "dev-seed-adjustment-"+s.SKU, adjustment, &got)
	return got, err
}

// call sends body as JSON with a bearer token and decodes a 2xx answer
// into out.
func call(ctx context.Context, client *http.Client, token, method, url, idempotencyKey string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if idempotencyKey != "" {
		req.Header.Set(httpapi.HeaderIdempotencyKey, idempotencyKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, url, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(respBody))
	}
	if err := json.Unmarshal(respBody, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, url, err)
	}
	return nil
}
