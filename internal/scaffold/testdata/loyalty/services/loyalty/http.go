package loyalty

import (
	_ "embed"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
)

//go:embed openapi.yaml
var openAPI []byte

// CustomerEvents is the starter tally of a customer as the API shows it:
// how many events the service handled for the customer.
type CustomerEvents struct {
	CustomerID string `json:"customer_id"`
	Events     int64  `json:"events"`
}

// Routes registers the loyalty API. Every route is described in
// openapi.yaml; a test checks that the two agree.
func (s *Service) Routes(e *echo.Echo) {
	e.GET("/openapi.yaml", func(c echo.Context) error { return c.Blob(http.StatusOK, "application/yaml", openAPI) })
	e.GET("/customers/:customer_id", s.getCustomerEvents)
}

// getCustomerEvents answers the customer or an operator; anyone else gets
// the 404 of a customer that does not exist, so that a stranger cannot tell.
func (s *Service) getCustomerEvents(c echo.Context) error {
	customerID, err := httpapi.PathCustomer(c, "customer_id")
	if err != nil {
		return err
	}
	if !auth.Sees(c, customerID) {
		return httpapi.NotFound("customer %s does not exist", customerID)
	}
	row, err := s.queries.GetCustomerEvents(c.Request().Context(), s.pool, customerID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return c.JSON(http.StatusOK, CustomerEvents{CustomerID: customerID}) // nothing handled yet
	case err != nil:
		return fmt.Errorf("get events of customer %s: %w", customerID, err)
	}
	return c.JSON(http.StatusOK, CustomerEvents{CustomerID: row.CustomerID, Events: row.Events})
}
