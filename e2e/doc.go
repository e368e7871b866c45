// Package e2e will hold the end-to-end fault-injection suite: it builds the
// onceflow binary, runs every service as its own process, drives the HTTP
// APIs, injects faults (kills, restarts, duplicates, poison) and runs the
// invariant auditor. It arrives with the fault-suite issue.
package e2e
