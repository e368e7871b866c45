package httpapi

import (
	"log/slog"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// New returns an echo instance with the shared error handler, panic recovery
// and no banner. The middleware mw (e.g. Observe) is installed first, outside
// the panic recovery.
func New(logger *slog.Logger, mw ...echo.MiddlewareFunc) *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = ErrorHandler(logger)
	e.Use(mw...)
	e.Use(middleware.Recover())
	return e
}
