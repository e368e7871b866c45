package inventory

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/inventory/internal/dbsqlc"
)

//go:embed openapi.yaml
var openAPI []byte

// StockItem is a SKU's stock as the API shows it.
type StockItem struct {
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
	// Version counts the writes of the SKU's level, reservations included
	// (also its ETag): a stock count names the version it counted.
	Version int64 `json:"version"`
}

// Kinds of stock movement, as stored: every change of a level that is not a
// reservation.
const (
	MovementReceipt    = "RECEIPT"
	MovementAdjustment = "ADJUSTMENT"
	MovementCount      = "COUNT"
)

type receiptRequest struct {
	Quantity int64 `json:"quantity"`
}

type adjustmentRequest struct {
	Delta  int64  `json:"delta"`
	Reason string `json:"reason"`
}

type countRequest struct {
	// A pointer, so that a missing or null level is refused instead of
	// silently emptying the SKU.
	Available *int64 `json:"available"`
	Reason    string `json:"reason"`
}

const (
	// MaxAvailable bounds a SKU's level: far above any real stock, far
	// below where sums of levels could overflow.
	MaxAvailable = 1_000_000_000
	// maxReason bounds a movement's reason, in characters.
	maxReason = 200
)

// Routes registers the inventory API. The writes are an operator's: each
// is a handler of its own, to be wrapped alike.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	e.GET("/stock/:sku", s.getStock)
	// Stock changes are an operator's; any caller may read a level.
	e.POST("/stock/:sku/receipts", s.receive, auth.AdminOnly)
	e.POST("/stock/:sku/adjustments", s.adjust, auth.AdminOnly)
	e.PUT("/stock/:sku", s.count, auth.AdminOnly)
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
	return sendStock(c, StockItem{SKU: item.Sku, Available: item.Available, Version: item.Version})
}

// receive adds goods received to a SKU's level, creating the SKU if it is
// new. It is a delta, so its Idempotency-Key is what makes a retry safe.
func (s *Service) receive(c echo.Context) error {
	var req receiptRequest
	sku, body, err := readWrite(c, &req)
	if err != nil {
		return err
	}
	if req.Quantity <= 0 || req.Quantity > MaxAvailable {
		return httpapi.BadRequest("quantity must be between 1 and %d", MaxAvailable)
	}
	return httpapi.Idempotent(c, s.idem, body, func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (int, any, error) {
		item, err := s.queries.ReceiveStock(ctx, tx, dbsqlc.ReceiveStockParams{Sku: sku, Quantity: req.Quantity, MaxAvailable: MaxAvailable})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return 0, nil, httpapi.NewProblem(http.StatusUnprocessableEntity, "sku %q would hold more than %d", sku, MaxAvailable)
		case err != nil:
			return 0, nil, fmt.Errorf("receive stock of %s: %w", sku, err)
		}
		if err := s.recordMovement(ctx, writes, sku, MovementReceipt, req.Quantity, ""); err != nil {
			return 0, nil, err
		}
		return http.StatusOK, StockItem{SKU: item.Sku, Available: item.Available, Version: item.Version}, nil
	})
}

// adjust corrects a SKU's level by a signed delta (damaged goods, a found
// pallet), with the reason. Like a receipt, it is applied once per key.
func (s *Service) adjust(c echo.Context) error {
	var req adjustmentRequest
	sku, body, err := readWrite(c, &req)
	if err != nil {
		return err
	}
	switch {
	case req.Delta == 0 || req.Delta < -MaxAvailable || req.Delta > MaxAvailable:
		return httpapi.BadRequest("delta must be between %d and %d, and not 0", -MaxAvailable, MaxAvailable)
	case strings.TrimSpace(req.Reason) == "":
		return httpapi.BadRequest("an adjustment needs a reason")
	}
	if err := httpapi.CheckText("reason", req.Reason, maxReason); err != nil {
		return err
	}
	return httpapi.Idempotent(c, s.idem, body, func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (int, any, error) {
		item, err := s.setLevel(ctx, tx, sku, func(cur dbsqlc.LockStockItemRow) (int64, error) {
			level := cur.Available + req.Delta
			switch {
			case level < 0:
				return 0, httpapi.NewProblem(http.StatusConflict, "sku %q has %d available, fewer than %d", sku, cur.Available, -req.Delta)
			case level > MaxAvailable:
				return 0, httpapi.NewProblem(http.StatusUnprocessableEntity, "sku %q would hold more than %d", sku, MaxAvailable)
			}
			return level, nil
		})
		if err != nil {
			return 0, nil, err
		}
		if err := s.recordMovement(ctx, writes, sku, MovementAdjustment, req.Delta, req.Reason); err != nil {
			return 0, nil, err
		}
		return http.StatusOK, item, nil
	})
}

// count sets a SKU's level to what a stock count found, on the condition
// that the level is still the one counted: If-Match names its version. A
// reservation since then changed the version, and the count is refused
// (412) instead of putting the reserved units back on the shelf; so is
// "If-Match: *", which names no version. It records the difference as a
// movement.
func (s *Service) count(c echo.Context) error {
	var req countRequest
	sku, _, err := readWrite(c, &req)
	if err != nil {
		return err
	}
	switch {
	case req.Available == nil || *req.Available < 0 || *req.Available > MaxAvailable:
		return httpapi.BadRequest("available must be between 0 and %d", MaxAvailable)
	}
	if err := httpapi.CheckText("reason", req.Reason, maxReason); err != nil {
		return err
	}
	match := c.Request().Header.Get("If-Match")
	if match == "" {
		return httpapi.NewProblem(http.StatusPreconditionRequired, "a stock count needs If-Match with the version counted (GET /stock/%s)", sku)
	}
	var item StockItem
	err = pgx.BeginFunc(c.Request().Context(), s.pool, func(tx pgx.Tx) error {
		var delta int64
		item, err = s.setLevel(c.Request().Context(), tx, sku, func(cur dbsqlc.LockStockItemRow) (int64, error) {
			if match != etag(cur.Version) {
				return 0, httpapi.NewProblem(http.StatusPreconditionFailed, "sku %q is at version %d, not %s: count again", sku, cur.Version, match)
			}
			delta = *req.Available - cur.Available
			return *req.Available, nil
		})
		if err != nil {
			return err
		}
		return s.recordMovement(c.Request().Context(), tx, sku, MovementCount, delta, req.Reason)
	})
	if err != nil {
		return err
	}
	return sendStock(c, item)
}

// setLevel locks sku's row, asks level for its new level (or an error),
// and sets it.
func (s *Service) setLevel(ctx context.Context, tx pgx.Tx, sku string, level func(dbsqlc.LockStockItemRow) (int64, error)) (StockItem, error) {
	cur, err := s.queries.LockStockItem(ctx, tx, sku)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return StockItem{}, httpapi.NotFound("sku %q is unknown", sku)
	case err != nil:
		return StockItem{}, fmt.Errorf("lock stock of %s: %w", sku, err)
	}
	available, err := level(cur)
	if err != nil {
		return StockItem{}, err
	}
	item, err := s.queries.SetStockLevel(ctx, tx, dbsqlc.SetStockLevelParams{Sku: sku, Available: available})
	if err != nil {
		return StockItem{}, fmt.Errorf("set stock of %s: %w", sku, err)
	}
	return StockItem{SKU: item.Sku, Available: item.Available, Version: item.Version}, nil
}

func (s *Service) recordMovement(ctx context.Context, db dbsqlc.DBTX, sku, kind string, delta int64, reason string) error {
	err := s.queries.InsertStockMovement(ctx, db, dbsqlc.InsertStockMovementParams{Sku: sku, Kind: kind, Delta: delta, Reason: reason})
	if err != nil {
		return fmt.Errorf("record %s of %s: %w", kind, sku, err)
	}
	return nil
}

// readWrite reads a stock write: its SKU, its body, and the body decoded
// into req.
func readWrite(c echo.Context, req any) (sku string, body []byte, err error) {
	if sku, err = httpapi.PathString(c, "sku"); err != nil {
		return "", nil, err
	}
	if body, err = httpapi.ReadBody(c); err != nil {
		return "", nil, err
	}
	if err := httpapi.Decode(body, req); err != nil {
		return "", nil, err
	}
	return sku, body, nil
}

// sendStock answers with item and its version as the ETag.
func sendStock(c echo.Context, item StockItem) error {
	c.Response().Header().Set("ETag", etag(item.Version))
	return c.JSON(http.StatusOK, item)
}

// etag is a version as an entity tag.
func etag(version int64) string { return strconv.Quote(strconv.FormatInt(version, 10)) }
