package order

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/order/internal/dbsqlc"
)

// Bounds of the catalog. A price this high times MaxQuantity times MaxItems
// still fits an order's total in an int64.
const (
	MaxUnitPriceCents  = 1_000_000_000
	maxProductName     = 200
	defaultProductPage = 50
	maxProductPage     = 100
)

// Product is a product of the catalog as the API shows it.
type Product struct {
	SKU            string    `json:"sku"`
	Name           string    `json:"name"`
	UnitPriceCents int64     `json:"unit_price_cents"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// ProductList is the answer of GET /products: a page in SKU order, and the
// cursor of the next one (pass it as ?next=), empty on the last page.
type ProductList struct {
	Products []Product `json:"products"`
	Next     string    `json:"next,omitempty"`
}

type putProductRequest struct {
	Name string `json:"name"`
	// A pointer, so that a missing price is refused rather than taken as 0.
	UnitPriceCents *int64 `json:"unit_price_cents"`
}

func productOf(p dbsqlc.Product) Product {
	return Product{SKU: p.Sku, Name: p.Name, UnitPriceCents: p.UnitPriceCents, UpdatedAt: p.UpdatedAt.UTC()}
}

// putProduct sets a product's name and price (an operator's, AdminOnly).
// A PUT is idempotent by nature, so it needs no Idempotency-Key.
func (s *Service) putProduct(c echo.Context) error {
	sku, err := httpapi.PathString(c, "sku")
	if err != nil {
		return err
	}
	var req putProductRequest
	if err := httpapi.Bind(c, &req); err != nil {
		return err
	}
	switch {
	case req.UnitPriceCents == nil || *req.UnitPriceCents < 1 || *req.UnitPriceCents > MaxUnitPriceCents:
		return httpapi.BadRequest("unit_price_cents must be between 1 and %d", MaxUnitPriceCents)
	}
	if err := httpapi.CheckText("name", req.Name, maxProductName); err != nil {
		return err
	}
	p, err := s.queries.PutProduct(c.Request().Context(), s.pool, dbsqlc.PutProductParams{Sku: sku, Name: req.Name, UnitPriceCents: *req.UnitPriceCents})
	if err != nil {
		return fmt.Errorf("put product %s: %w", sku, err)
	}
	return c.JSON(http.StatusOK, productOf(p))
}

func (s *Service) getProduct(c echo.Context) error {
	sku, err := httpapi.PathString(c, "sku")
	if err != nil {
		return err
	}
	p, err := s.queries.GetProduct(c.Request().Context(), s.pool, sku)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return httpapi.NotFound("sku %q is not in the catalog", sku)
	case err != nil:
		return fmt.Errorf("get product %s: %w", sku, err)
	}
	return c.JSON(http.StatusOK, productOf(p))
}

func (s *Service) listProducts(c echo.Context) error {
	limit, err := httpapi.QueryLimit(c, defaultProductPage, maxProductPage)
	if err != nil {
		return err
	}
	// The cursor is the last SKU of the page before: an id like any SKU,
	// checked before it reaches PostgreSQL (which refuses invalid UTF-8
	// and NUL as a 500's error).
	next := c.QueryParam("next")
	if next != "" {
		if err := httpapi.CheckID("next", next); err != nil {
			return err
		}
	}
	rows, err := s.queries.ListProducts(c.Request().Context(), s.pool, dbsqlc.ListProductsParams{After: next, MaxRows: int32(limit + 1)})
	if err != nil {
		return fmt.Errorf("list products: %w", err)
	}
	var list ProductList
	if len(rows) > limit {
		rows = rows[:limit]
		list.Next = rows[len(rows)-1].Sku
	}
	list.Products = make([]Product, len(rows))
	for i, p := range rows {
		list.Products[i] = productOf(p)
	}
	return c.JSON(http.StatusOK, list)
}

// price prices lines from the catalog, in the order's transaction: each
// line gets its SKU's price now, which the order keeps whatever the price
// becomes. A SKU not in the catalog is a 422 that names it.
//
// With a check, when the service read every SKU's price before, it prices
// the lines at those and queues CheckPrices on writes instead of reading:
// the order takes one round trip instead of two, and the check, in the
// same transaction, fails the order (check.refused) unless every price is
// still the catalog's. Otherwise it reads the prices on tx.
func (s *Service) price(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline, lines event.Lines, check *priceCheck) (int64, error) {
	skus := make([]string, len(lines))
	for i, l := range lines {
		skus[i] = l.SKU
	}
	if check != nil && s.prices.price(lines) {
		prices := make([]int64, len(lines))
		for i, l := range lines {
			prices[i] = l.UnitPriceCents
		}
		check.queued, check.index = true, writes.Len()
		if err := s.queries.CheckPrices(ctx, writes, dbsqlc.CheckPricesParams{Skus: skus, Prices: prices}); err != nil {
			return 0, fmt.Errorf("check order prices: %w", err)
		}
	} else if err := s.readPrices(ctx, tx, skus, lines); err != nil {
		return 0, err
	}
	total, err := lines.Total()
	if err != nil {
		return 0, httpapi.BadRequest("the order's total is too large: %v", err)
	}
	return total, nil
}

// readPrices prices lines, whose SKUs are skus, from the catalog's prices
// read on tx, and remembers them for the next orders' guesses.
func (s *Service) readPrices(ctx context.Context, tx pgx.Tx, skus []string, lines event.Lines) error {
	rows, err := s.queries.PriceSKUs(ctx, tx, skus)
	if err != nil {
		return fmt.Errorf("price order lines: %w", err)
	}
	prices := make(map[string]int64, len(rows))
	for _, r := range rows {
		prices[r.Sku] = r.UnitPriceCents
	}
	s.prices.remember(skus, prices)
	var unknown []string
	for i := range lines {
		p, ok := prices[lines[i].SKU]
		if !ok {
			unknown = append(unknown, strconv.Quote(lines[i].SKU))
		}
		lines[i].UnitPriceCents = p
	}
	if len(unknown) > 0 {
		return httpapi.NewProblem(http.StatusUnprocessableEntity, "not in the catalog: %s", strings.Join(unknown, ", "))
	}
	return nil
}

// priceCheck is where price queued CheckPrices among an order's writes, if
// it did.
type priceCheck struct {
	queued bool
	index  int
}

// refused reports whether err is the check failing: a price the order was
// given is no longer the catalog's.
func (c *priceCheck) refused(err error) bool {
	qe, ok := errors.AsType[*postgres.QueryError](err)
	return ok && c.queued && qe.Index == c.index
}

// knownPrices are the catalog's prices as this replica of the service last
// read them: guesses, which CheckPrices confirms in each order's
// transaction, and which a failed check makes it read again. It holds at
// most one price per SKU of the catalog.
type knownPrices struct {
	mu     sync.RWMutex
	prices map[string]int64
}

func newKnownPrices() *knownPrices { return &knownPrices{prices: map[string]int64{}} }

// price sets each line's price to the known one; ok is false, and the
// lines' prices are not to be used, when a SKU has none.
func (k *knownPrices) price(lines event.Lines) (ok bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for i := range lines {
		if lines[i].UnitPriceCents, ok = k.prices[lines[i].SKU]; !ok {
			return false
		}
	}
	return true
}

// remember keeps the prices read of skus; a SKU without one is no longer
// in the catalog, and forgotten.
func (k *knownPrices) remember(skus []string, read map[string]int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, sku := range skus {
		if p, ok := read[sku]; ok {
			k.prices[sku] = p
		} else {
			delete(k.prices, sku)
		}
	}
}
