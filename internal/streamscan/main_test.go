package streamscan_test

import (
	"os"
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }
