package apptest

import (
	"io"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
)

// sharedRoutes are served by internal/app for every service.
var sharedRoutes = []string{"GET /healthz", "GET /readyz", "GET /metrics"}

var echoParam = regexp.MustCompile(`:([a-zA-Z_]+)`)

// RequireOpenAPI checks that the service's served OpenAPI document is valid
// and describes exactly the routes that exist (routes registers the
// service's own, and the shared ones are added), and that the running
// service asks for a token exactly where the document says: every route but
// the ones documented with security: [] answers 401 without a token and
// with a forged one.
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

	public := publicRoutes(t, spec)
	forged := s.forgedToken(t)
	for _, route := range served {
		method, path, _ := strings.Cut(route, " ")
		url := s.BaseURL + echoParam.ReplaceAllString(strings.NewReplacer("{", ":", "}", "").Replace(path), uuid.NewString())
		if public[route] {
			status := s.send(t, method, url, nil).StatusCode
			require.NotEqual(t, http.StatusUnauthorized, status, "%s is documented as public", route)
			if slices.Contains(sharedRoutes, route) {
				require.Equal(t, http.StatusOK, status, route)
			}
			continue
		}
		// Every other route refuses a request without a token, or with a
		// token its issuer did not sign, before anything else.
		for name, header := range map[string]http.Header{
			"anonymous": nil,
			"forged":    {"Authorization": {"Bearer " + forged}},
		} {
			resp := s.send(t, method, url, header)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s %s", name, route)
			require.True(t, strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer "), "%s %s", name, route)
			require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"), "%s %s", name, route)
		}
		// And, with a token, the ones that need no path parameter exist.
		if method == http.MethodGet && !strings.Contains(path, "{") {
			status := s.send(t, method, url, s.AsAdmin(t)).StatusCode
			require.NotContains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, status, route)
		}
	}
}

// publicRoutes are the documented routes that need no token (security: []);
// every other must document its 401.
func publicRoutes(t *testing.T, spec *openapi3.T) map[string]bool {
	t.Helper()
	require.Contains(t, spec.Components.SecuritySchemes, "bearerAuth")
	require.Equal(t, openapi3.SecurityRequirements{{"bearerAuth": {}}}, spec.Security, "every route needs a token unless it says otherwise")
	public := map[string]bool{}
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			route := strings.ToUpper(method) + " " + path
			if op.Security != nil && len(*op.Security) == 0 {
				public[route] = true
				continue
			}
			require.NotNil(t, op.Responses.Value("401"), "%s needs a token and documents no 401", route)
		}
	}
	return public
}

// forgedToken is an admin's token that names the service's issuer but is
// signed by another key.
func (s *Service) forgedToken(t *testing.T) string {
	t.Helper()
	forger, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: s.IssuerURL})
	require.NoError(t, err)
	tok, err := forger.Token(auth.TokenRequest{Subject: "operator", Admin: true})
	require.NoError(t, err)
	return tok
}

// send sends a request without a body and returns its answer, read.
func (s *Service) send(t *testing.T, method, url string, header http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	require.NoError(t, err)
	maps.Copy(req.Header, header)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}
