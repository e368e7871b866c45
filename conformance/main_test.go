package conformance_test

import (
	"os"
	"testing"

	"github.com/onceflow/onceflow/conformance"
)

func TestMain(m *testing.M) { os.Exit(conformance.Main(m)) }
