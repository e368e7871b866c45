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
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	if err := reapOrphans(ctx, c.dataDir()); err != nil {
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

// reapOrphans waits up to orphanGrace for the processes of the killed
// server on dataDir to exit, then kills those left and waits for them.
// They are found by their working directory, the data directory: each
// backend runs in a session of its own (PostgreSQL calls setsid), so the
// postmaster's process group does not hold them, and once it is dead they
// are the children of init.
func reapOrphans(ctx context.Context, dataDir string) error {
	deadline := time.Now().Add(orphanGrace)
	killed := false
	for {
		pids, err := processesIn(dataDir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if !killed && time.Now().After(deadline) {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			killed, deadline = true, time.Now().Add(orphanGrace)
		} else if killed && time.Now().After(deadline) {
			return fmt.Errorf("the processes %v of the killed server on %s did not exit after SIGKILL", pids, dataDir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// processesIn returns the processes whose working directory is dir. A
// zombie, waiting to be reaped by whoever adopted it, has none (nor any
// shared memory attached) and is not one of them.
func processesIn(dir string) ([]int, error) {
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	cwds, err := filepath.Glob("/proc/[0-9]*/cwd")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, cwd := range cwds {
		got, err := os.Readlink(cwd)
		if err != nil || got != want {
			continue // exited meanwhile, a zombie, or not ours to read
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(cwd))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// ReapProcesses waits a few seconds for the PostgreSQL processes running in
// dataDir to exit and kills those left, for a server that localpg did not
// start: a Patroni node's postmaster runs in a session of its own, adopted
// by init, so killing Patroni leaves it (and its backends) behind.
func ReapProcesses(ctx context.Context, dataDir string) error {
	return reapOrphans(ctx, dataDir)
}
