package order

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/httpapi"
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
	case len(req.Name) > maxProductName:
		return httpapi.BadRequest("name must be at most %d bytes", maxProductName)
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
	rows, err := s.queries.ListProducts(c.Request().Context(), s.pool, dbsqlc.ListProductsParams{After: c.QueryParam("next"), MaxRows: int32(limit + 1)})
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
func (s *Service) price(ctx context.Context, tx pgx.Tx, lines event.Lines) (int64, error) {
	skus := make([]string, len(lines))
	for i, l := range lines {
		skus[i] = l.SKU
	}
	rows, err := s.queries.PriceSKUs(ctx, tx, skus)
	if err != nil {
		return 0, fmt.Errorf("price order lines: %w", err)
	}
	prices := make(map[string]int64, len(rows))
	for _, r := range rows {
		prices[r.Sku] = r.UnitPriceCents
	}
	var unknown []string
	for i := range lines {
		p, ok := prices[lines[i].SKU]
		if !ok {
			unknown = append(unknown, strconv.Quote(lines[i].SKU))
		}
		lines[i].UnitPriceCents = p
	}
	if len(unknown) > 0 {
		return 0, httpapi.NewProblem(http.StatusUnprocessableEntity, "not in the catalog: %s", strings.Join(unknown, ", "))
	}
	total, err := lines.Total()
	if err != nil {
		return 0, httpapi.BadRequest("the order's total is too large: %v", err)
	}
	return total, nil
}
