package hapg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Primary returns the index of the node that is the primary now.
func (c *Cluster) Primary(ctx context.Context) (int, error) {
	return c.primary(ctx)
}

func (c *Cluster) primary(ctx context.Context) (int, error) {
	for i, n := range c.nodes {
		if n == nil || n.patroni == nil {
			continue
		}
		if _, status, err := c.get(ctx, n.apiURL("/primary")); err == nil && status == http.StatusOK {
			return i, nil
		}
	}
	return -1, errors.New("hapg: no node is the primary")
}

// Switchover is Patroni's planned switchover (patronictl switchover): the
// primary shuts down cleanly, the standby is promoted, and the old primary
// follows it. It returns the new primary's index once it replicates to the
// old one as configured.
func (c *Cluster) Switchover(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	from, err := c.primary(ctx)
	if err != nil {
		return -1, err
	}
	to := (from + 1) % nodes
	if c.nodes[to].patroni == nil {
		return -1, fmt.Errorf("hapg: switchover: %s was killed", c.nodes[to].name)
	}
	body, err := json.Marshal(map[string]string{"leader": c.nodes[from].name, "candidate": c.nodes[to].name})
	if err != nil {
		return -1, err
	}
	// Patroni answers once the candidate is promoted, or failed to be.
	answer, status, err := c.post(ctx, c.nodes[from].apiURL("/switchover"), body)
	if err != nil {
		return -1, fmt.Errorf("hapg: switchover: %w", err)
	}
	if status != http.StatusOK {
		return -1, fmt.Errorf("hapg: switchover: Patroni answered %d: %s", status, answer)
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if _, err := c.awaitReplicating(ctx, to); err != nil {
		return -1, fmt.Errorf("hapg: after switchover: %w", err)
	}
	c.logger.InfoContext(ctx, "patroni switchover", "from", c.nodes[from].name, "to", c.nodes[to].name)
	return to, nil
}

// KillPrimary kills the primary's node as a machine would die: its Patroni
// and its postmaster with SIGKILL, nothing shut down cleanly, and the
// backends left to notice. The node stays dead. Once the leader key
// expires (Patroni's ttl, six seconds) the standby is promoted, if Patroni
// finds it fit: with synchronous_mode, only a synchronous standby is. It
// returns the new primary's index once it accepts writes.
func (c *Cluster) KillPrimary(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dead, err := c.primary(ctx)
	if err != nil {
		return -1, err
	}
	n := c.nodes[dead]
	// Patroni first, so that it cannot restart the server.
	n.patroni.kill()
	n.patroni = nil
	if err := c.killPostmaster(ctx, n); err != nil {
		return -1, fmt.Errorf("hapg: kill primary: %w", err)
	}
	to := (dead + 1) % nodes
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := c.awaitPrimary(ctx, to); err != nil {
		return -1, fmt.Errorf("hapg: after killing the primary: %w", err)
	}
	c.logger.InfoContext(ctx, "patroni failover", "from", n.name, "to", c.nodes[to].name)
	return to, nil
}

// CrashPrimary kills the primary's postmaster with SIGKILL, as the OOM
// killer would, and leaves its Patroni running. Patroni fails over rather
// than restart it (primary_start_timeout is 0): it releases the leader key,
// the standby is promoted, and the old primary follows it, rewound if it
// had WAL the new one lacks. It returns the new primary's index once the
// old one replicates from it as configured.
func (c *Cluster) CrashPrimary(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	crashed, err := c.primary(ctx)
	if err != nil {
		return -1, err
	}
	n := c.nodes[crashed]
	if err := c.killPostmaster(ctx, n); err != nil {
		return -1, fmt.Errorf("hapg: crash primary: %w", err)
	}
	to := (crashed + 1) % nodes
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if _, err := c.awaitReplicating(ctx, to); err != nil {
		return -1, fmt.Errorf("hapg: after crashing the primary: %w", err)
	}
	c.logger.InfoContext(ctx, "patroni failover", "from", n.name, "to", c.nodes[to].name)
	return to, nil
}

// HoldReplication stops every node's replication proxy forwarding WAL: the
// standby receives nothing from here on, while the primary goes on
// committing (with Async; with a synchronous standby its commits wait). It
// cannot be undone: it is for a test that then kills the primary.
func (c *Cluster) HoldReplication() {
	for _, n := range c.nodes {
		n.proxy.hold()
	}
}

// killPostmaster kills node n's postmaster with SIGKILL; its backends see
// it gone and exit.
func (c *Cluster) killPostmaster(ctx context.Context, n *node) error {
	pid, err := postmasterPID(n.dataDir())
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill postmaster %d: %w", pid, err)
	}
	c.logger.InfoContext(ctx, "patroni node's postmaster killed", "node", n.name, "postmaster", pid)
	return nil
}

// postmasterPID reads the postmaster's process id from its pid file.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(dataDir + "/postmaster.pid")
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// awaitReplicating waits until one node is the primary (node want, unless
// want is negative) and the other streams from it, synchronously unless
// Async, and returns the primary's index.
func (c *Cluster) awaitReplicating(ctx context.Context, want int) (int, error) {
	primary := -1
	err := await(ctx, c.etcd, "a primary and a streaming standby", func(ctx context.Context) (bool, error) {
		p, err := c.primary(ctx)
		if err != nil || (want >= 0 && p != want) {
			return false, err
		}
		standby := c.nodes[(p+1)%nodes]
		role := "/sync"
		if c.cfg.Async {
			role = "/replica"
		}
		if _, status, err := c.get(ctx, standby.apiURL(role)); err != nil || status != http.StatusOK {
			return false, err
		}
		sql := `SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'`
		if !c.cfg.Async {
			sql += ` AND sync_state = 'sync'`
		}
		ok, err := c.query(ctx, p, sql)
		primary = p
		return ok, err
	})
	return primary, err
}

// awaitPrimary waits until node i is the primary and accepts writes.
func (c *Cluster) awaitPrimary(ctx context.Context, i int) error {
	return await(ctx, c.etcd, c.nodes[i].name+" the primary", func(ctx context.Context) (bool, error) {
		if _, status, err := c.get(ctx, c.nodes[i].apiURL("/primary")); err != nil || status != http.StatusOK {
			return false, err
		}
		return c.query(ctx, i, `SELECT NOT pg_is_in_recovery()`)
	})
}

// query runs sql, which reads one boolean, on node i.
func (c *Cluster) query(ctx context.Context, i int, sql string, args ...any) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.NodeURL(i, "postgres"))
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	err = conn.QueryRow(ctx, sql, args...).Scan(&ok)
	return ok, err
}

func (c *Cluster) get(ctx context.Context, url string) (string, int, error) {
	return c.do(ctx, http.MethodGet, url, nil, 2*time.Second)
}

func (c *Cluster) post(ctx context.Context, url string, body []byte) (string, int, error) {
	// A switchover takes a few of Patroni's loops.
	return c.do(ctx, http.MethodPost, url, body, readyTimeout)
}

func (c *Cluster) do(ctx context.Context, method, url string, body []byte, timeout time.Duration) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return "", 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

// AwaitReplay waits until the standby has replayed what the primary had
// written when it was called. A synchronous standby confirms a commit once
// the WAL is flushed, before it is replayed: a database just created may not
// be there yet, and pgx gives up a multi-host connection at the first
// server that answers that the database does not exist.
func (c *Cluster) AwaitReplay(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	primary, err := c.primary(ctx)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.NodeURL(primary, "postgres"))
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	var written string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&written)
	_ = conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	standby := (primary + 1) % nodes
	return await(ctx, c.etcd, c.nodes[standby].name+" replayed "+written, func(ctx context.Context) (bool, error) {
		return c.query(ctx, standby, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, written)
	})
}
