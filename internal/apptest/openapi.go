package apptest

import (
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/httpapi"
)

// sharedRoutes are served by internal/app for every service.
var sharedRoutes = []string{"GET /healthz", "GET /readyz", "GET /metrics"}

var echoParam = regexp.MustCompile(`:([a-zA-Z_]+)`)

// RequireOpenAPI checks that the service's served OpenAPI document is valid
// and describes exactly the routes that exist: routes registers the
// service's own, and the shared ones are added.
func (s *Service) RequireOpenAPI(t *testing.T, routes func(*echo.Echo)) {
	t.Helper()
	resp, err := http.Get(s.BaseURL + "/openapi.yaml")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	doc, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	spec, err := openapi3.NewLoader().LoadFromData(doc)
	require.NoError(t, err)
	require.NoError(t, spec.Validate(t.Context()), "the OpenAPI document is invalid")
	var documented []string
	for path, item := range spec.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}

	e := httpapi.New(slog.New(slog.DiscardHandler))
	routes(e)
	served := slices.Clone(sharedRoutes)
	for _, r := range e.Routes() {
		served = append(served, r.Method+" "+echoParam.ReplaceAllString(r.Path, "{$1}"))
	}
	slices.Sort(documented)
	slices.Sort(served)
	require.Equal(t, served, slices.Compact(documented), "documented routes differ from served routes")

	// And the running service answers them: the shared routes with 200, the
	// others that need no path parameter with anything but 404 or 405.
	for _, route := range served {
		method, path, _ := strings.Cut(route, " ")
		if method != http.MethodGet || strings.Contains(path, "{") {
			continue
		}
		resp, err := http.Get(s.BaseURL + path)
		require.NoError(t, err)
		resp.Body.Close()
		if slices.Contains(sharedRoutes, route) {
			require.Equal(t, http.StatusOK, resp.StatusCode, route)
		} else {
			require.NotContains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, resp.StatusCode, route)
		}
	}
}
