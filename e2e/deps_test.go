package e2e

// The suite runs the onceflow binary it builds (see build), which the go
// command's test cache cannot see: a change to a service would leave the
// suite's last result cached, and `go test ./...` would not run it again.
// Importing the code the binary is made of ties the cached result to it.
import _ "github.com/onceflow/onceflow/internal/cli"
