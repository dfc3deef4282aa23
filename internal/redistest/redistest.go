// Package redistest connects tests to the Redis servers that the test
// command (scripts/test.sh, through scripts/redis-topology.sh) starts on
// loopback ports, and gives fault tests control over those servers'
// processes. It also offers a TCP proxy that can cut the connection to a
// server or drop its replies.
//
// # Topologies
//
// The test command starts three topologies and describes them in the
// environment:
//
//   - a standalone server: $HYBRIDLIMIT_REDIS_ADDR (Addr, Client);
//   - a Redis Cluster of 3 masters and 3 replicas:
//     $HYBRIDLIMIT_CLUSTER_ADDRS, comma-separated (ClusterAddrs,
//     ClusterClient);
//   - a Sentinel group, a master and a replica watched by three sentinels
//     with quorum 2: $HYBRIDLIMIT_SENTINEL_ADDRS, comma-separated, and
//     $HYBRIDLIMIT_SENTINEL_MASTER, the master's name (SentinelAddrs,
//     SentinelMaster, SentinelClient, FailoverClient);
//
// and $HYBRIDLIMIT_REDIS_DIR, the directory holding one sub-directory per
// server (<kind>-<port>: its config file, pidfile, log and cluster state).
// When a variable is unset, tests that need it skip, except under CI=true,
// where they fail: CI must never pass by skipping.
//
// # Sharing the servers
//
// go test runs the packages of the module in parallel processes, all on the
// same servers. A test that breaks servers (kills, stops or fails them
// over) must not run while another test uses them, so every test holds a
// cross-process lock on the topologies (flock on a file in
// $HYBRIDLIMIT_REDIS_DIR) for its whole duration: Addr, ClusterAddrs,
// SentinelAddrs and every helper built on them take it shared; a fault
// test takes it exclusive, first, by calling Destructive (or
// LockTopology(t, true)). Waiting writers go first: once a fault test
// waits for the lock, new tests wait behind it, so a fault test waits at
// most for the tests already running. Subtests share their parent's lock.
// A test that asked for the lock shared cannot upgrade it to exclusive:
// call Destructive before any other helper. Call t.Parallel before any
// helper too: a test paused by t.Parallel while it holds the lock would
// keep a fault test of its package waiting (until the lock's 4-minute
// limit fails it).
//
// # Fault tests
//
// ServerAt finds a server's process by its address; Server.Kill,
// Server.Stop, Server.Cont and Server.Restart send SIGKILL, SIGSTOP and
// SIGCONT or start it again from its config file. ClusterMasters,
// MasterForKey and WaitClusterOK observe the cluster; SentinelFailover and
// WaitSentinelStable drive and observe the Sentinel group. Destructive
// registers a cleanup (HealTopologies) that restarts what the test killed,
// resumes what it stopped and waits until every topology is healthy again
// (after a failover the roles may stay swapped), so the next test finds
// them whole.
package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The environment variables that describe the test servers.
const (
	// EnvAddr holds the standalone server's address.
	EnvAddr = "HYBRIDLIMIT_REDIS_ADDR"
	// EnvClusterAddrs holds the addresses of every node of the cluster,
	// comma-separated.
	EnvClusterAddrs = "HYBRIDLIMIT_CLUSTER_ADDRS"
	// EnvSentinelAddrs holds the addresses of the sentinels,
	// comma-separated.
	EnvSentinelAddrs = "HYBRIDLIMIT_SENTINEL_ADDRS"
	// EnvSentinelMaster holds the name under which the sentinels monitor
	// their master.
	EnvSentinelMaster = "HYBRIDLIMIT_SENTINEL_MASTER"
	// EnvDir holds the directory of the servers' config files, pidfiles
	// and logs, and of the topology lock.
	EnvDir = "HYBRIDLIMIT_REDIS_DIR"
)

// env returns the value of the environment variable name, or ends the
// test: Skip when it is unset, Fatal when it is unset under CI=true.
func env(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set but CI=true: run the tests with scripts/test.sh, which starts %s", name, what)
		}
		t.Skipf("%s is not set: run scripts/test.sh, or eval \"$(scripts/redis-topology.sh start)\" first, to run the tests that need %s", name, what)
	}
	return v
}

// Addr returns the standalone test server's address and takes the
// topology lock shared, or ends the test: Skip when the variable is unset,
// Fatal when it is unset under CI=true.
func Addr(t testing.TB) string {
	t.Helper()
	addr := env(t, EnvAddr, "redis-server")
	LockTopology(t, false)
	return addr
}

// Client returns a client of the standalone test server, closed when the test ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	return ClientAt(t, Addr(t))
}

// ClientAt returns a client of the server at addr, closed when the test
// ends, after checking that the server answers.
func ClientAt(t testing.TB, addr string) *redis.Client {
	t.Helper()
	return clientAt(t, addr, time.Second)
}

// PatientClient is Client with a minute, rather than a second, for
// dialing and for each reply: for tests whose claim needs every call
// answered (exactness, agreement with a model), so that a loaded machine,
// which can keep the goroutine reading a reply off a processor for more
// than a second, does not end the call in doubt.
func PatientClient(t testing.TB) *redis.Client {
	t.Helper()
	return clientAt(t, Addr(t), time.Minute)
}

func clientAt(t testing.TB, addr string, timeout time.Duration) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unreachable(t, addr, err)
	}
	return c
}

// unreachable ends a test whose server does not answer: Fatal when the
// test command started the servers or under CI=true, else Skip.
func unreachable(t testing.TB, addr string, err error) {
	t.Helper()
	if os.Getenv(EnvAddr) != "" || os.Getenv("CI") == "true" {
		t.Fatalf("redis at %s does not answer: %v", addr, err)
	}
	t.Skipf("redis at %s does not answer: %v", addr, err)
}

// Prefix returns a counter prefix unique to this test run, so that tests
// sharing the server never see each other's counters.
func Prefix(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r == '{' || r == '}' || r == ':' || r == '/' || r == ' ' {
			return '_'
		}
		return r
	}, t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return fmt.Sprintf("t_%s_%x", name, rand.Uint32())
}
