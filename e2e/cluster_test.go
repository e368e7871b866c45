package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/testenv"
)

// natsCluster is three nats-server processes routed into one JetStream
// cluster on loopback, each with its own store. A node can be killed,
// stopped and started again on its port and store; with proxied routes, it
// can be cut off from the others.
type natsCluster struct {
	nodes []*natsServer
	// links are the route proxies of a proxied cluster, by the node that
	// dials and the node dialed (links[i][j]); nil otherwise.
	links [][]*toxicProxy
}

// clusterBlock is a node's cluster configuration, after natsConfig. The
// node advertises a route address nothing listens on: a node that learns
// of a peer through another node's gossip would otherwise dial the peer's
// own address, around the proxy that a partition cuts; every route is then
// one of the configured ones.
const clusterBlock = `cluster {
  name: e2e
  listen: 127.0.0.1:%d
  advertise: 127.0.0.1:%d
  routes: [%s]
}
`

// startCluster starts three nodes whose files live under dir, routed
// directly or, with px, through a proxy per ordered pair of nodes.
func startCluster(t *testing.T, dir, authConf string, px *toxics) *natsCluster {
	t.Helper()
	const n = 3
	ports := testenv.FreePorts(t, 4*n) // client, monitor, route, advertised
	c := &natsCluster{}
	routeAddr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[4*i+2]) }
	if px != nil {
		c.links = make([][]*toxicProxy, n)
		for i := range n {
			c.links[i] = make([]*toxicProxy, n)
			for j := range n {
				if i != j {
					c.links[i][j] = px.proxy(t, fmt.Sprintf("route-n%d-n%d", i+1, j+1), routeAddr(j))
				}
			}
		}
	}
	for i := range n {
		var routes []string
		for j := range n {
			switch {
			case i == j:
			case px != nil:
				routes = append(routes, "nats-route://"+c.links[i][j].addr())
			default:
				routes = append(routes, "nats-route://"+routeAddr(j))
			}
		}
		name := fmt.Sprintf("n%d", i+1)
		nodeDir := filepath.Join(dir, name)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			t.Fatalf("e2e: %v", err)
		}
		node := &natsServer{
			bin:      shared.natsBin,
			confPath: filepath.Join(nodeDir, "nats.conf"),
			logPath:  filepath.Join(dir, "nats-"+name+".log"),
			port:     ports[4*i],
			monitor:  ports[4*i+1],
			name:     name,
		}
		conf := authConf + fmt.Sprintf(natsConfig, name, node.port, node.monitor, filepath.Join(nodeDir, "jetstream")) +
			fmt.Sprintf(clusterBlock, ports[4*i+2], ports[4*i+3], strings.Join(routes, ", "))
		if err := os.WriteFile(node.confPath, []byte(conf), 0o644); err != nil {
			t.Fatalf("e2e: write nats config: %v", err)
		}
		c.nodes = append(c.nodes, node)
		t.Cleanup(node.stop)
	}
	// A node is ready once it has a meta leader: all must be up for that.
	g, ctx := errgroup.WithContext(t.Context())
	for _, node := range c.nodes {
		g.Go(func() error { return node.start(ctx) })
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("e2e: start the cluster: %v", err)
	}
	return c
}

// urls are the nodes' client URLs.
func (c *natsCluster) urls() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.url()
	}
	return urls
}

// url lists the nodes' client URLs, as NATS_URL takes them.
func (c *natsCluster) url() string { return strings.Join(c.urls(), ",") }

// node returns the node named name (a leader's name in stream info).
func (c *natsCluster) node(name string) (*natsServer, error) {
	for _, n := range c.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no cluster node %q", name)
}

// newClusterSystem is newSystem on a three-node cluster.
func newClusterSystem(t *testing.T, proxied bool) *system {
	t.Helper()
	return newSystemWith(t, func(sys *system) {
		var px *toxics
		if proxied {
			px = newToxics()
		}
		sys.cluster = startCluster(t, sys.dir, sys.authConf, px)
		sys.natsURL = sys.cluster.url()
	})
}

// clusterScenario starts a system on a cluster, the services with R3
// streams and consumers and every node's URL, plus env, and seeds a driver
// for n orders. The ack wait is 5s (CONSUMER_ACK_WAIT): a delivery whose
// ack went down with its consumer's leader comes again only after it, and
// the default 30s would make the scenario mostly a wait.
func clusterScenario(t *testing.T, proxied bool, env []string, n int) (*system, *driver) {
	t.Helper()
	sys := newClusterSystem(t, proxied)
	// The services provision at start-up; the meta leader must be there.
	if err := sys.awaitCurrent(t.Context(), time.Minute); err != nil {
		t.Fatalf("e2e: %v", err)
	}
	// Provisioned by sys.start, as `onceflow provision` with this env.
	env = append([]string{"STREAM_REPLICAS=3", "CONSUMER_ACK_WAIT=5s"}, env...)
	perKind := map[string][]string{}
	for _, kind := range kinds {
		perKind[kind] = env
	}
	return sys, startDriver(t, sys, deployment{env: perKind}, n)
}

// awaitCurrent waits until every node runs and every stream and consumer
// has a leader and two replicas caught up: the cluster can lose a node
// again without losing a majority.
func (sys *system) awaitCurrent(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		// Each check bounded: a request sent while the connection was
		// failing over waits for its context's end.
		check, cancelCheck := context.WithTimeout(ctx, 5*time.Second)
		err := sys.clusterLag(check)
		cancelCheck()
		if err == nil {
			return nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("the cluster did not catch up within %s: %w", timeout, err)
		}
	}
}

// clusterLag says what is not yet replicated, or nil.
func (sys *system) clusterLag(ctx context.Context) error {
	for _, n := range sys.cluster.nodes {
		if !n.running() {
			return fmt.Errorf("%s is down", n.name)
		}
	}
	if _, err := sys.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// The listers' goroutines end only once drained: every info is read
	// before any is judged.
	var lag []error
	lister := sys.js.ListStreams(ctx)
	var names []string
	for info := range lister.Info() {
		names = append(names, info.Config.Name)
		lag = append(lag, replicated(info.Config.Name, info.Cluster))
	}
	lag = append(lag, lister.Err())
	for _, name := range names {
		s, err := sys.js.Stream(ctx, name)
		if err != nil {
			return err
		}
		consumers := s.ListConsumers(ctx)
		for info := range consumers.Info() {
			lag = append(lag, replicated(info.Name, info.Cluster))
		}
		lag = append(lag, consumers.Err())
	}
	return errors.Join(lag...)
}

func replicated(name string, c *jetstream.ClusterInfo) error {
	if c == nil || c.Leader == "" {
		return fmt.Errorf("%s has no leader", name)
	}
	if len(c.Replicas) != 2 {
		return fmt.Errorf("%s has %d replicas besides its leader", name, len(c.Replicas))
	}
	for _, r := range c.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("%s: replica %s is not current", name, r.Name)
		}
	}
	return nil
}

// streamLeader returns the node leading stream, waiting out an election.
func (sys *system) streamLeader(ctx context.Context, stream string) (*natsServer, error) {
	return sys.leader(ctx, func(ctx context.Context) (*jetstream.ClusterInfo, error) {
		s, err := sys.js.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		return info.Cluster, nil
	})
}

// consumerLeader returns the node leading durable, waiting out an
// election.
func (sys *system) consumerLeader(ctx context.Context, stream, durable string) (*natsServer, error) {
	return sys.leader(ctx, func(ctx context.Context) (*jetstream.ClusterInfo, error) {
		info, err := sys.consumerInfo(ctx, stream, durable)
		if err != nil {
			return nil, err
		}
		return info.Cluster, nil
	})
}

func (sys *system) leader(ctx context.Context, cluster func(context.Context) (*jetstream.ClusterInfo, error)) (*natsServer, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		call, cancelCall := context.WithTimeout(ctx, 5*time.Second)
		c, err := cluster(call)
		cancelCall()
		if err == nil && c != nil && c.Leader != "" {
			return sys.cluster.node(c.Leader)
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return nil, errors.Join(errors.New("no leader elected"), err, ctx.Err())
		}
	}
}

// bounce kills node with SIGKILL, leaves it down for a moment, starts it
// again on its store and waits until the cluster has caught up.
func (sys *system) bounce(ctx context.Context, node *natsServer, fault string) error {
	if err := node.kill(); err != nil {
		return err
	}
	sys.faults.add(fault, 1)
	sleepCtx(ctx, jitter(time.Second, 2*time.Second))
	if err := node.start(ctx); err != nil {
		return err
	}
	return sys.awaitCurrent(ctx, 90*time.Second)
}

// verifyStoredOnce fails the test with loadErr, the load's, if any; else it
// verifies the system and that no event is stored twice.
func (sys *system) verifyStoredOnce(d *driver, loadErr error) {
	sys.t.Helper()
	if loadErr != nil {
		sys.t.Fatal(loadErr)
	}
	sys.verify(d, expect{})
	sys.checkStoredOnce()
}

// checkStoredOnce fails the test if an event is stored twice in a stream.
func (sys *system) checkStoredOnce() {
	t := sys.t
	t.Helper()
	twice, err := sys.storedTwice(t.Context())
	if err != nil {
		t.Fatalf("e2e: %v", err)
	}
	if len(twice) > 0 {
		t.Errorf("e2e: %d events stored twice in the streams: %v", len(twice), twice)
	}
}

// clusterLoad is the cluster scenarios' default load: short, as the suite
// must stay within a few minutes; E2E_SCALE lengthens it for soaks.
func clusterLoad() int { return scaled(200) }
