package inbox_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The README shows processOne as the function that runs by default: it must
// be the code, not a sketch of it.
func TestTheReadmeShowsProcessOneAsItIs(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	code, err := os.ReadFile("process.go")
	require.NoError(t, err)
	fn := func(s string) string {
		i := strings.Index(s, "func (c *Consumer) processOne(")
		require.GreaterOrEqual(t, i, 0)
		j := strings.Index(s[i:], "\n}\n")
		require.Greater(t, j, 0)
		return s[i : i+j+2]
	}
	require.Equal(t, fn(string(code)), fn(string(readme)))
}
