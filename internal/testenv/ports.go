package testenv

import "testing"

// FreePorts returns n TCP ports on 127.0.0.1 for servers that the test starts
// by port number, and may stop and start again on the same port. No other
// process takes one of them by chance (see package freeport), and none is
// handed out twice in a test binary.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		port, err := shared.ports.Take()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		ports[i] = port
	}
	return ports
}
