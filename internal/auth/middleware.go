package auth

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// realm names the protection space in WWW-Authenticate (RFC 6750).
const realm = "onceflow"

// identityKey is where Middleware keeps the caller's Identity on the echo
// context.
const identityKey = "onceflow.auth.identity"

// Middleware returns the echo middleware that verifies the bearer token of
// every request for which public is false and puts its Identity on the
// context (see Caller). A request without a token, or with one v refuses,
// gets a 401 with WWW-Authenticate: Bearer (and error="invalid_token" for a
// bad one). public may be nil: every route needs a token.
func (v *Verifier) Middleware(public func(echo.Context) bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if public != nil && public(c) {
				return next(c)
			}
			token, ok := bearer(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="`+realm+`"`)
				return echo.NewHTTPError(http.StatusUnauthorized, "a bearer token is required")
			}
			id, err := v.Verify(c.Request().Context(), token)
			if err != nil {
				// The reason stays out of the header and the answer: it
				// would help a forger more than a client.
				c.Response().Header().Set(echo.HeaderWWWAuthenticate,
					`Bearer realm="`+realm+`", error="invalid_token", error_description="the token is invalid or has expired"`)
				return echo.NewHTTPError(http.StatusUnauthorized, "the bearer token is invalid or has expired")
			}
			c.Set(identityKey, id)
			return next(c)
		}
	}
}

// bearer returns the token of an Authorization header of the Bearer
// scheme, whose name is case-insensitive (RFC 9110, 11.1).
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// Caller is the Identity Middleware verified for the request, and false on
// a public route (or without the middleware).
func Caller(c echo.Context) (Identity, bool) {
	id, ok := c.Get(identityKey).(Identity)
	return id, ok
}

// Sees reports whether the request's caller may see customer's resources:
// it is the customer, or an operator. Handlers answer 404 when it does not,
// as for a resource that does not exist, so that a stranger cannot tell.
func Sees(c echo.Context, customer string) bool {
	id, ok := Caller(c)
	return ok && (id.Admin || id.Subject == customer)
}

// RequireAdmin is a 403 unless the request's caller is an operator.
func RequireAdmin(c echo.Context) error {
	if id, ok := Caller(c); ok && id.Admin {
		return nil
	}
	return echo.NewHTTPError(http.StatusForbidden, "this needs the admin role")
}

// AdminOnly is the middleware form of RequireAdmin, for a route or group.
func AdminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := RequireAdmin(c); err != nil {
			return err
		}
		return next(c)
	}
}
