package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/onceflow/onceflow/internal/audit"
)

// pageNames are the pages, each a template file beside layout.html.
var pageNames = []string{"orders", "order", "pipeline", "dlq", "dlqentry", "audit", "login", "error"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"cents":    func(c int64) string { return fmt.Sprintf("%d.%02d", c/100, c%100) },
		"time":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
		"ago":      func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
		"short":    shortType,
		"figure":   formatFigure,
		"setParam": withParam,
		"join":     strings.Join,
		"lower":    strings.ToLower,
		"latency":  formatLatency,
	}
	pages := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// withParam is the query q with key set to value: a link to the next page.
func withParam(q url.Values, key, value string) string {
	v := url.Values{}
	for k, vs := range q {
		v[k] = slices.Clone(vs)
	}
	v.Set(key, value)
	return v.Encode()
}

func formatFigure(v any) string {
	m, ok := v.(map[string]int64)
	if !ok {
		return fmt.Sprint(v)
	}
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func prettyJSON(data []byte) string {
	var b bytes.Buffer
	if json.Indent(&b, data, "", "  ") != nil {
		return fmt.Sprintf("%q", data)
	}
	return b.String()
}

// auditPage offers to run the auditor's checks: they read every database
// and stream, so only when an operator posts the form (never on a GET,
// which any page could make a browser send).
func (s *Server) auditPage(c echo.Context) error {
	return s.render(c, http.StatusOK, "audit", map[string]any{})
}

// auditRun runs the auditor's checks and shows them.
func (s *Server) auditRun(c echo.Context) error {
	cfg := s.cfg.Audit
	cfg.Wait = 0
	report, err := audit.Run(c.Request().Context(), cfg, s.logger)
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, "audit", map[string]any{"Report": report})
}

func (s *Server) loginPage(c echo.Context) error {
	who, _ := s.who(c)
	return s.render(c, http.StatusOK, "login", map[string]any{"Operator": who, "Hint": s.cfg.AuthHint, "Next": localPath(c.QueryParam("next"), "")})
}

// login starts a session for the token the operator pasted, its id in a
// cookie that only this site's own requests carry, and sends them on to
// next, a path on this site.
func (s *Server) login(c echo.Context) error {
	if !sameOrigin(c.Request()) {
		return echo.NewHTTPError(http.StatusForbidden, "a form from another site")
	}
	if s.cfg.Auth == nil {
		return echo.NewHTTPError(http.StatusForbidden, "this console lets nobody sign in")
	}
	token := strings.TrimSpace(c.FormValue("token"))
	next := localPath(c.FormValue("next"), "/orders")
	op, err := s.cfg.Auth.Operator(c.Request().Context(), token)
	switch {
	case errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrForbidden):
		return s.render(c, http.StatusForbidden, "login", map[string]any{"Error": "that token is not an operator's: " + err.Error(), "Hint": s.cfg.AuthHint, "Next": next})
	case err != nil:
		return err
	}
	cookie, err := s.startSession(c.Request(), token, op)
	if err != nil {
		return err
	}
	c.SetCookie(cookie)
	return c.Redirect(http.StatusSeeOther, next)
}

// logout ends the browser's session: its cookie, and any copy of it, signs
// nobody in any more.
func (s *Server) logout(c echo.Context) error {
	if !sameOrigin(c.Request()) {
		return echo.NewHTTPError(http.StatusForbidden, "a form from another site")
	}
	c.SetCookie(s.endSession(c.Request()))
	return c.Redirect(http.StatusSeeOther, "/login")
}
