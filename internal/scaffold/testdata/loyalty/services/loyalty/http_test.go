package loyalty_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/loyalty"
)

func TestUnknownCustomerHasNoEvents(t *testing.T) {
	t.Parallel()
	svc := start(t)
	require.Equal(t, int64(0), customerEvents(t, svc, "nobody"))
}

func TestBadCustomerIDIsAProblem(t *testing.T) {
	t.Parallel()
	svc := start(t)
	for _, path := range []string{"/customers/" + strings.Repeat("c", 129), "/customers/%C3%A9"} {
		resp := svc.Do(t, http.MethodGet, path, svc.AsAdmin(t), nil, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, path)
		require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"), path)
	}
}

func TestOpenAPIDescribesTheRoutes(t *testing.T) {
	t.Parallel()
	start(t).RequireOpenAPI(t, loyalty.New(nil).Routes)
}
