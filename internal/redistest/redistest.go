// Package redistest connects tests to the Redis server that the test
// command (scripts/test.sh) starts, and offers a TCP proxy that can cut
// the connection to it, for outage tests.
//
// The server's address comes from $HYBRIDLIMIT_REDIS_ADDR. When it is
// unset, tests that need Redis skip, except under CI=true, where they fail:
// CI must never pass by skipping.
package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
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

// Proxy forwards TCP connections to a target and can cut them all, to
// rehearse a store outage.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	drop  bool // discard the server's replies
	conns map[net.Conn]bool
}

// NewProxy starts a proxy to target on a free loopback port, stopped when
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Down()
	})
	return p
}

// Addr returns the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Down closes every connection and refuses new ones until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Up accepts connections again and forwards replies again.
func (p *Proxy) Up() {
	p.mu.Lock()
	p.down, p.drop = false, false
	p.mu.Unlock()
}

// DropReplies keeps forwarding commands to the server but discards its
// replies, until Up: the server executes what it is sent, and the client
// never learns it did (a reply lost on the way).
func (p *Proxy) DropReplies() {
	p.mu.Lock()
	p.drop = true
	p.mu.Unlock()
}

func (p *Proxy) dropping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drop
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		go p.pipe(c, s, true)
		go p.pipe(s, c, false)
	}
}

func (p *Proxy) pipe(dst, src net.Conn, replies bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !(replies && p.dropping()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
