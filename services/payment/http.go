package payment

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/services/payment/internal/dbsqlc"
)

//go:embed openapi.yaml
var openAPI []byte

// Wallet is a wallet as the API shows it.
type Wallet struct {
	CustomerID   string `json:"customer_id"`
	BalanceCents int64  `json:"balance_cents"`
}

type creditRequest struct {
	AmountCents int64 `json:"amount_cents"`
}

// maxCreditCents bounds one credit so that balances cannot overflow.
const maxCreditCents = 1_000_000_000_00

// Routes registers the payment API.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	e.GET("/wallets/:customer_id", s.getWallet)
	e.POST("/wallets/:customer_id/credits", s.credit, auth.AdminOnly)
}

// getWallet shows a wallet to its owner and to operators; to anyone else
// it does not exist.
func (s *Service) getWallet(c echo.Context) error {
	customerID, err := httpapi.PathCustomer(c, "customer_id")
	if err != nil {
		return err
	}
	if !auth.Sees(c, customerID) {
		return httpapi.NotFound("wallet %s does not exist", customerID)
	}
	w, err := s.queries.GetWallet(c.Request().Context(), s.pool, customerID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return c.JSON(http.StatusOK, Wallet{CustomerID: customerID}) // never credited: balance 0
	case err != nil:
		return fmt.Errorf("get wallet %s: %w", customerID, err)
	}
	return c.JSON(http.StatusOK, Wallet{CustomerID: w.CustomerID, BalanceCents: w.BalanceCents})
}

// credit credits a wallet: an operator's act (AdminOnly).
func (s *Service) credit(c echo.Context) error {
	customerID, err := httpapi.PathCustomer(c, "customer_id")
	if err != nil {
		return err
	}
	body, err := httpapi.ReadBody(c)
	if err != nil {
		return err
	}
	var req creditRequest
	if err := httpapi.Decode(body, &req); err != nil {
		return err
	}
	if req.AmountCents <= 0 || req.AmountCents > maxCreditCents {
		return httpapi.BadRequest("amount_cents must be between 1 and %d", int64(maxCreditCents))
	}
	return httpapi.Idempotent(c, s.idem, body, func(ctx context.Context, tx pgx.Tx, writes *postgres.Pipeline) (int, any, error) {
		w, err := s.queries.CreditWallet(ctx, tx, dbsqlc.CreditWalletParams{CustomerID: customerID, AmountCents: req.AmountCents})
		if err != nil {
			if httpapi.IsNumericOverflow(err) {
				return 0, nil, httpapi.NewProblem(http.StatusUnprocessableEntity, "the balance would overflow")
			}
			return 0, nil, fmt.Errorf("credit wallet %s: %w", customerID, err)
		}
		id, err := uuid.NewV7()
		if err != nil {
			return 0, nil, err
		}
		// The credit's record goes with the COMMIT.
		if err := s.queries.RecordCredit(ctx, writes, dbsqlc.RecordCreditParams{ID: id, CustomerID: customerID, AmountCents: req.AmountCents}); err != nil {
			return 0, nil, fmt.Errorf("record credit of %s: %w", customerID, err)
		}
		return http.StatusOK, Wallet{CustomerID: w.CustomerID, BalanceCents: w.BalanceCents}, nil
	})
}
