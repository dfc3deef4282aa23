// Package redistest connects tests to the Redis server that the test
// command (scripts/test.sh) starts, and offers a TCP proxy (proxy.go) that
// can cut the connection to it, for outage tests.
//
// The server's address comes from $HYBRIDLIMIT_REDIS_ADDR. When it is
// unset, tests that need Redis skip, except under CI=true, where they fail:
// CI must never pass by skipping.
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

// EnvAddr is the environment variable holding the test server's address.
const EnvAddr = "HYBRIDLIMIT_REDIS_ADDR"

// Addr returns the test server's address, or ends the test: Skip when the
// variable is unset, Fatal when it is unset under CI=true or the server
// does not answer.
func Addr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvAddr)
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set but CI=true: run the tests with scripts/test.sh, which starts redis-server", EnvAddr)
		}
		t.Skipf("%s is not set: run scripts/test.sh to run the tests that need Redis", EnvAddr)
	}
	return addr
}

// Client returns a client of the test server, closed when the test ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	return ClientAt(t, Addr(t))
}

// ClientAt returns a client of the server at addr, closed when the test
// ends, after checking that the server answers.
func ClientAt(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv(EnvAddr) != "" || os.Getenv("CI") == "true" {
			t.Fatalf("redis at %s does not answer: %v", addr, err)
		}
		t.Skipf("redis at %s does not answer: %v", addr, err)
	}
	return c
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
