package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// rawPipe sends the sync loop's pipelines to a standalone Redis over
// connections of its own, writing the commands straight into a reused
// buffer in Redis's wire format (RESP2) and parsing the integer replies in
// place. go-redis allocates several objects per command; this path
// allocates nothing per counter, which is where most of a large sync
// cycle's time went. It keeps at most two idle connections.
type rawPipe struct {
	opt *redis.Options

	mu   sync.Mutex
	idle []*rawConn
}

type rawConn struct {
	c   net.Conn
	r   *bufio.Reader
	buf []byte
}

// newRawPipe returns a raw pipe for the client c, or nil when c is not a
// standalone client or uses features the raw path would bypass
// (credential providers, OnConnect hooks, a client-side rate limiter).
func newRawPipe(c redis.UniversalClient) *rawPipe {
	cl, ok := c.(*redis.Client)
	if !ok {
		return nil
	}
	opt := cl.Options()
	if opt.Dialer == nil || opt.OnConnect != nil || opt.CredentialsProvider != nil ||
		opt.CredentialsProviderContext != nil || opt.StreamingCredentialsProvider != nil || opt.Limiter != nil {
		return nil
	}
	return &rawPipe{opt: opt}
}

func (p *rawPipe) get(ctx context.Context) (*rawConn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	nc, err := p.opt.Dialer(ctx, p.opt.Network, p.opt.Addr)
	if err != nil {
		return nil, err
	}
	c := &rawConn{c: nc, r: bufio.NewReaderSize(nc, 64<<10)}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if err := c.handshake(p.opt); err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

func (p *rawPipe) put(c *rawConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) >= 2 {
		_ = c.c.Close()
		return
	}
	if cap(c.buf) > 8<<20 {
		c.buf = nil // do not pin the buffer of an unusually large cycle
	}
	p.idle = append(p.idle, c)
}

// close closes the idle connections.
func (p *rawPipe) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle {
		_ = c.c.Close()
	}
	p.idle = nil
}

func (c *rawConn) handshake(opt *redis.Options) error {
	var cmds [][]string
	if opt.Password != "" {
		if opt.Username != "" {
			cmds = append(cmds, []string{"AUTH", opt.Username, opt.Password})
		} else {
			cmds = append(cmds, []string{"AUTH", opt.Password})
		}
	}
	if opt.DB != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(opt.DB)})
	}
	if len(cmds) == 0 {
		return nil
	}
	buf := c.buf[:0]
	for _, cmd := range cmds {
		buf = appendArrayHeader(buf, len(cmd))
		for _, a := range cmd {
			buf = appendBulk(buf, a)
		}
	}
	if _, err := c.c.Write(buf); err != nil {
		return err
	}
	for range cmds {
		line, err := c.line()
		if err != nil {
			return err
		}
		if len(line) == 0 || line[0] != '+' {
			return fmt.Errorf("store: redis handshake: %s", line)
		}
	}
	return nil
}

// apply runs ops as one pipeline: INCRBY or GET per op, then PEXPIREAT
// where asked.
func (p *rawPipe) apply(ctx context.Context, ops []Op) error {
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	if err := c.apply(ctx, ops); err != nil {
		_ = c.c.Close()
		return err
	}
	p.put(c)
	return nil
}

func (c *rawConn) apply(ctx context.Context, ops []Op) error {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	if err := c.c.SetDeadline(dl); err != nil {
		return err
	}
	// Write while another goroutine reads the replies, so that neither
	// side's socket buffer fills while the other waits.
	readErr := make(chan error, 1)
	go func() { readErr <- c.readReplies(ops) }()
	buf := c.buf[:0]
	var werr error
	for i := range ops {
		op := &ops[i]
		if op.Delta != 0 {
			buf = append(buf, "*3\r\n$6\r\nINCRBY\r\n"...)
			buf = appendBulk(buf, op.Key)
			buf = appendBulkInt(buf, op.Delta)
		} else {
			buf = append(buf, "*2\r\n$3\r\nGET\r\n"...)
			buf = appendBulk(buf, op.Key)
		}
		if op.ExpireAt != 0 {
			buf = append(buf, "*3\r\n$9\r\nPEXPIREAT\r\n"...)
			buf = appendBulk(buf, op.Key)
			buf = appendBulkInt(buf, op.ExpireAt)
		}
		if len(buf) >= 256<<10 {
			if _, werr = c.c.Write(buf); werr != nil {
				break
			}
			buf = buf[:0]
		}
	}
	if werr == nil && len(buf) > 0 {
		_, werr = c.c.Write(buf)
	}
	c.buf = buf[:0]
	if werr != nil {
		_ = c.c.Close() // unblocks the reader
		<-readErr
		return fmt.Errorf("store: redis pipeline of %d counters: %w", len(ops), werr)
	}
	if err := <-readErr; err != nil {
		return fmt.Errorf("store: redis pipeline of %d counters: %w", len(ops), err)
	}
	return nil
}

var errReply = errors.New("store: unexpected reply")

func (c *rawConn) readReplies(ops []Op) error {
	for i := range ops {
		op := &ops[i]
		line, err := c.line()
		if err != nil {
			return err
		}
		switch {
		case op.Delta != 0: // INCRBY: an integer
			if op.Total, err = parseInt(line, ':'); err != nil {
				return fmt.Errorf("INCRBY %q: %w", op.Key, err)
			}
		default: // GET: a bulk string holding an integer, or nil
			if len(line) > 0 && line[0] == '$' {
				n, err := parseInt(line, '$')
				if err != nil {
					return fmt.Errorf("GET %q: %w", op.Key, err)
				}
				if n < 0 {
					op.Total = 0
					break
				}
				if n > 20 {
					return fmt.Errorf("GET %q: a value of %d bytes is not a counter", op.Key, n)
				}
				val, err := c.line()
				if err != nil {
					return err
				}
				if op.Total, err = strconv.ParseInt(string(val), 10, 64); err != nil {
					return fmt.Errorf("GET %q: counter holds %q, not an integer", op.Key, val)
				}
				break
			}
			return fmt.Errorf("GET %q: %w %q", op.Key, errReply, line)
		}
		if op.ExpireAt != 0 {
			line, err := c.line()
			if err != nil {
				return err
			}
			if _, err := parseInt(line, ':'); err != nil {
				return fmt.Errorf("PEXPIREAT %q: %w", op.Key, err)
			}
		}
	}
	return nil
}

// line reads one reply line without its CRLF. The slice is valid until the
// next read.
func (c *rawConn) line() ([]byte, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'}), nil
}

// parseInt parses a reply line of the given type (':' or '$') as an
// integer; an error reply becomes an error.
func parseInt(line []byte, kind byte) (int64, error) {
	if len(line) == 0 {
		return 0, errReply
	}
	if line[0] == '-' {
		return 0, redisError(line[1:])
	}
	if line[0] != kind {
		return 0, fmt.Errorf("%w %q", errReply, line)
	}
	var n int64
	neg := false
	digits := line[1:]
	if len(digits) > 0 && digits[0] == '-' {
		neg, digits = true, digits[1:]
	}
	if len(digits) == 0 || len(digits) > 19 {
		return 0, fmt.Errorf("%w %q", errReply, line)
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("%w %q", errReply, line)
		}
		n = n*10 + int64(d-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// redisError is an error reply from the server.
type redisError string

func (e redisError) Error() string { return string(e) }

func appendArrayHeader(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

func appendBulkInt(b []byte, v int64) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], v, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(d)), 10)
	b = append(b, '\r', '\n')
	b = append(b, d...)
	return append(b, '\r', '\n')
}
