package console

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
)

// nonceKey is where a request's CSP nonce is kept in its echo.Context.
const nonceKey = "csp-nonce"

// hostSet is the Host headers the console answers: "name" (any port) or
// "name:port", compared without case.
type hostSet []string

// defaultHosts are the Host headers a console listening on addr answers
// when none are configured: addr itself and, when it listens on a loopback
// or unspecified address, the loopback names with its port, as a browser
// on the same machine (or through a published port) writes them.
func defaultHosts(addr net.Addr) hostSet {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return hostSet{addr.String()}
	}
	hosts := hostSet{tcp.String()}
	if tcp.IP.IsLoopback() || tcp.IP.IsUnspecified() {
		port := ":" + strconv.Itoa(tcp.Port)
		hosts = append(hosts, "localhost"+port, "127.0.0.1"+port, "[::1]"+port)
	}
	return hosts
}

// allows reports whether host, a request's Host header, is one of hs.
func (hs hostSet) allows(host string) bool {
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		name = host
	}
	for _, h := range hs {
		if strings.EqualFold(h, host) || strings.EqualFold(h, name) && !strings.Contains(h, ":") {
			return true
		}
	}
	return false
}

// guard refuses requests for a host the console was not configured for (a
// DNS-rebinding page is "same origin" with any name that resolves to the
// console), except /healthz, which probes call by address; and sets the
// headers that keep every page out of frames and scripts out of pages.
func (s *Server) guard(hosts hostSet) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			nonce := newNonce()
			c.Set(nonceKey, nonce)
			h := c.Response().Header()
			h.Set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-"+nonce+"'; style-src 'nonce-"+nonce+"'; "+
				"connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
			h.Set("X-Frame-Options", "DENY")
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("Referrer-Policy", "same-origin")
			if r := c.Request(); r.URL.Path != "/healthz" && !hosts.allows(r.Host) {
				return echo.NewHTTPError(http.StatusMisdirectedRequest, "this console does not answer to that host name")
			}
			return next(c)
		}
	}
}

func newNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// signedIn lets only an operator see what next serves. Anyone else who asks
// for a page is sent to the sign-in page, which brings them back; anything
// else is refused. Who it is, is in the context's "operator".
func (s *Server) signedIn(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		op, err := s.operatorOf(c.Request())
		switch {
		case err == nil:
			c.Set("operator", op.Name)
			return next(c)
		case !errors.Is(err, ErrUnauthenticated) && !errors.Is(err, ErrForbidden):
			return err // logged; the browser sees "internal error"
		}
		r := c.Request()
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return echo.NewHTTPError(http.StatusUnauthorized, "only an operator can do this: sign in first")
		}
		return c.Redirect(http.StatusSeeOther, "/login?next="+url.QueryEscape(r.URL.RequestURI()))
	}
}

// localPath returns next if it is a path on this site, else fallback: the
// only places a sign-in may send the browser on to. "//host", "/\host"
// (which browsers read as "//host"), schemes, hosts, backslashes and
// control characters anywhere are refused.
func localPath(next, fallback string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") ||
		strings.ContainsAny(next, "\\") || strings.ContainsFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fallback
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") {
		return fallback
	}
	return next
}
