package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/internal/idempotency"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// A key is bound to its whole request: a retry with the same method, path
// and body is replayed, and the same key with another body or another path
// of the route is a 422, in both ways of writing.
func TestIdempotencyKeyIsBoundToTheRequest(t *testing.T) {
	t.Parallel()
	db := testenv.NewServiceDatabase(t, "")
	_, err := db.Pool.Exec(t.Context(), `CREATE TABLE things (id text NOT NULL)`)
	require.NoError(t, err)
	store := idempotency.NewStore(db.Pool, 0)
	e := httpapi.New(slog.New(slog.DiscardHandler))
	e.POST("/do/:id", func(c echo.Context) error {
		return httpapi.Idempotent(c, store, []byte(c.QueryParam("body")), func(ctx context.Context, _ pgx.Tx, writes *postgres.Pipeline) (int, any, error) {
			_, err := writes.Exec(ctx, `INSERT INTO things VALUES ($1)`, c.Param("id"))
			return http.StatusCreated, map[string]string{"id": c.Param("id")}, err
		})
	})
	e.POST("/writes/:id", func(c echo.Context) error {
		return httpapi.IdempotentWrites(c, store, []byte(c.QueryParam("body")), func(ctx context.Context, _ pgx.Tx, writes *postgres.Pipeline) (int, any, error) {
			_, err := writes.Exec(ctx, `INSERT INTO things VALUES ($1)`, c.Param("id"))
			return http.StatusCreated, map[string]string{"id": c.Param("id")}, err
		})
	})

	for _, way := range []string{"/do/", "/writes/"} {
		key := "key" + strings.Trim(way, "/")
		post := func(path string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, path, nil)
			req.Header.Set(httpapi.HeaderIdempotencyKey, key)
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			return rec
		}
		first := post(way + "1?body=a")
		require.Equal(t, http.StatusCreated, first.Code, way)
		again := post(way + "1?body=a")
		require.Equal(t, http.StatusCreated, again.Code, way)
		require.Equal(t, "true", again.Header().Get(httpapi.HeaderReplayed), way)
		require.Equal(t, first.Body.String(), again.Body.String(), way)
		require.Equal(t, http.StatusUnprocessableEntity, post(way+"1?body=b").Code, "%s: another body", way)
		require.Equal(t, http.StatusUnprocessableEntity, post(way+"2?body=a").Code, "%s: another path of the route", way)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM things`).Scan(&n))
	require.Equal(t, 2, n, "one write per key")
}
