package redistest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a target and can cut them all, to
// rehearse a store outage.
type Proxy struct {
	ln     net.Listener
	target string

	drop atomic.Bool // discard the server's replies

	mu    sync.Mutex
	down  bool
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
	p.down = false
	p.drop.Store(false)
	p.mu.Unlock()
}

// DropReplies keeps forwarding commands to the server but discards its
// replies, until Up: the server executes what it is sent, and the client
// never learns it did (a reply lost on the way).
func (p *Proxy) DropReplies() { p.drop.Store(true) }

// serve accepts connections and connects each to the target in a
// goroutine of its own: neither a slow dial nor the lock held while
// dialing delays the other connections' traffic or their accepting.
func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.connect(c)
	}
}

// connect dials the target for the client connection c and forwards
// between the two, unless the proxy is down before or after the dial.
func (p *Proxy) connect(c net.Conn) {
	if p.isDown() {
		_ = c.Close()
		return
	}
	s, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.down { // Down ran during the dial: it closed what it knew
		p.mu.Unlock()
		_ = c.Close()
		_ = s.Close()
		return
	}
	p.conns[c], p.conns[s] = true, true
	p.mu.Unlock()
	go p.pipe(c, s, true)
	go p.pipe(s, c, false)
}

func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

func (p *Proxy) pipe(dst, src net.Conn, replies bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !(replies && p.drop.Load()) {
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
