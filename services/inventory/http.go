package inventory

import (
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/inventory/internal/dbsqlc"
)

//go:embed openapi.yaml
var openAPI []byte

// StockItem is a SKU's stock as the API shows it.
type StockItem struct {
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
}

type setStockRequest struct {
	// A pointer, so that a missing or null level is refused instead of
	// silently emptying the SKU.
	Available *int64 `json:"available"`
}

// MaxAvailable bounds a SKU's level: far above any real stock, far below
// where sums of levels could overflow.
const MaxAvailable = 1_000_000_000

// Routes registers the inventory API.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	e.GET("/stock/:sku", s.getStock)
	e.PUT("/stock/:sku", s.setStock)
}

func (s *Service) getStock(c echo.Context) error {
	sku, err := httpapi.PathString(c, "sku")
	if err != nil {
		return err
	}
	item, err := s.queries.GetStock(c.Request().Context(), s.pool, sku)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return httpapi.NotFound("sku %q is unknown", sku)
	case err != nil:
		return fmt.Errorf("get stock of %s: %w", sku, err)
	}
	return c.JSON(http.StatusOK, StockItem{SKU: item.Sku, Available: item.Available})
}

// setStock sets the absolute level of a SKU. A PUT is idempotent by nature
// (a retry sets the same level), so it needs no Idempotency-Key.
func (s *Service) setStock(c echo.Context) error {
	sku, err := httpapi.PathString(c, "sku")
	if err != nil {
		return err
	}
	body, err := httpapi.ReadBody(c)
	if err != nil {
		return err
	}
	var req setStockRequest
	if err := httpapi.Decode(body, &req); err != nil {
		return err
	}
	if req.Available == nil || *req.Available < 0 || *req.Available > MaxAvailable {
		return httpapi.BadRequest("available must be between 0 and %d", MaxAvailable)
	}
	item, err := s.queries.SetStock(c.Request().Context(), s.pool, dbsqlc.SetStockParams{Sku: sku, Available: *req.Available})
	if err != nil {
		return fmt.Errorf("set stock of %s: %w", sku, err)
	}
	return c.JSON(http.StatusOK, StockItem{SKU: item.Sku, Available: item.Available})
}
