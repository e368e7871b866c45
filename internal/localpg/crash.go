package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// orphanGrace is how long Crash lets the backends of a killed postmaster
// notice and exit on their own before it kills them.
const orphanGrace = 5 * time.Second

// recoveryLine is what PostgreSQL logs when it starts on a data directory
// whose last server did not shut down cleanly.
var recoveryLine = []byte("automatic recovery in progress")

// Crash kills the postmaster with SIGKILL, as the OOM killer or a crashing
// host process would, and starts the server again on the same data
// directory and port, which replays the WAL from the last checkpoint: crash
// recovery, where Restart is a clean shutdown. The backends of the killed
// postmaster see it gone and exit (one in the middle of a commit finishes
// it first); those still running after a few seconds are killed, since a
// new postmaster refuses to start while they hold the old shared memory.
// It returns once the server accepts connections, and an error if the
// server log does not show the recovery.
func (c *Cluster) Crash(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.proc == nil {
		return errors.New("crash postgres: the server is not running")
	}
	p := c.proc
	c.proc = nil
	pgid := p.cmd.Process.Pid // the postmaster leads its process group
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	if err := reapOrphans(ctx, pgid); err != nil {
		return fmt.Errorf("crash postgres: %w", err)
	}

	logStart := int64(0)
	if fi, err := os.Stat(c.logPath); err == nil {
		logStart = fi.Size()
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("crash postgres: start again: %w", err)
	}
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Errorf("crash postgres: read server log: %w", err)
	}
	if int64(len(b)) < logStart || !bytes.Contains(b[logStart:], recoveryLine) {
		return fmt.Errorf("crash postgres: the server started again without crash recovery; server log %s:\n%s", c.logPath, c.logTail())
	}
	c.logger.InfoContext(ctx, "postgres crashed and recovered", "port", c.port)
	return nil
}

// reapOrphans waits up to orphanGrace for the processes of group pgid to
// exit, then kills those left and waits for them.
func reapOrphans(ctx context.Context, pgid int) error {
	deadline := time.Now().Add(orphanGrace)
	killed := false
	for {
		alive, err := groupAlive(pgid)
		if err != nil {
			return err
		}
		if !alive {
			return nil
		}
		if !killed && time.Now().After(deadline) {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killed, deadline = true, time.Now().Add(orphanGrace)
		} else if killed && time.Now().After(deadline) {
			return fmt.Errorf("the backends of process group %d did not exit after SIGKILL", pgid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// groupAlive reports whether a process of group pgid is running: one not
// yet exited (a zombie waiting to be reaped by whoever adopted it holds no
// shared memory and does not count).
func groupAlive(pgid int) (bool, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return false, err
	}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid pgrp …"; comm may hold spaces and
		// parentheses, so the fields are counted from the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := bytes.Fields(b[i+1:])
		if len(fields) < 3 || string(fields[0]) == "Z" {
			continue
		}
		if g, err := strconv.Atoi(string(fields[2])); err == nil && g == pgid {
			return true, nil
		}
	}
	return false, nil
}
