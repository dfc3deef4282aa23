package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	opt    *redis.Options
	marker string // key of the last batch's sequence number (see apply)

	mu   sync.Mutex // guards idle
	idle []*rawConn

	txMu     sync.Mutex // one batch at a time; guards the fields below
	seq      uint64
	owed     map[string]int64 // increments Redis has that callers will push again
	maybe    map[string]int64 // increments of the failed batch maybeSeq, which may have landed
	maybeSeq uint64
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
	return &rawPipe{opt: opt, marker: fmt.Sprintf("hybridlimit:sync:%016x", rand.Uint64()), owed: map[string]int64{}}
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

// apply runs ops as one transaction (MULTI ... EXEC): INCRBY or GET per
// op, PEXPIREAT where asked, and a SET of the pipe's marker key to the
// batch's sequence number.
//
// The marker makes pushes exactly-once. When a batch fails after it was
// sent, Redis may or may not have executed it (the reply may be what was
// lost), and the caller will push the same increments again. Before the
// next batch, apply reads the marker: if the failed batch landed, its
// increments are owed, and are taken off the counters' next pushes instead
// of being added twice.
func (p *rawPipe) apply(ctx context.Context, ops []Op) error {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	c, err := p.get(ctx)
	if err != nil {
		return err // nothing was sent
	}
	if p.maybeSeq != 0 {
		landed, err := c.markerIs(ctx, p.marker, p.maybeSeq)
		if err != nil {
			_ = c.c.Close()
			return err
		}
		if landed {
			for k, d := range p.maybe {
				p.owed[k] += d
			}
		}
		p.maybe, p.maybeSeq = nil, 0
	}
	type took struct {
		i int
		d int64
	}
	var taken []took
	if len(p.owed) > 0 {
		for i := range ops {
			if ops[i].Delta <= 0 {
				continue
			}
			name := ops[i].Name()
			if d := min(p.owed[name], ops[i].Delta); d > 0 {
				ops[i].Delta -= d
				if p.owed[name] -= d; p.owed[name] == 0 {
					delete(p.owed, name)
				}
				taken = append(taken, took{i, d})
			}
		}
	}
	p.seq++
	if err := c.apply(ctx, ops, p.marker, p.seq); err != nil {
		_ = c.c.Close()
		// What was taken off is still owed; what was sent may have landed.
		for _, t := range taken {
			ops[t.i].Delta += t.d
			p.owed[ops[t.i].Name()] += t.d
		}
		p.maybe, p.maybeSeq = make(map[string]int64), p.seq
		for i := range ops {
			if ops[i].Delta > 0 {
				p.maybe[ops[i].Name()] += ops[i].Delta
			}
		}
		for _, t := range taken {
			p.maybe[ops[t.i].Name()] -= t.d
		}
		return err
	}
	for _, t := range taken {
		ops[t.i].Delta += t.d // the caller's view: its increments are in the total
	}
	p.put(c)
	return nil
}

// markerIs reports whether the marker key holds seq.
func (c *rawConn) markerIs(ctx context.Context, marker string, seq uint64) (bool, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
	}
	buf := append(c.buf[:0], "*2\r\n$3\r\nGET\r\n"...)
	buf = appendBulk(buf, marker)
	c.buf = buf[:0]
	if _, err := c.c.Write(buf); err != nil {
		return false, err
	}
	line, err := c.line()
	if err != nil {
		return false, err
	}
	n, err := parseInt(line, '$')
	if err != nil || n < 0 {
		return false, err
	}
	val, err := c.line()
	if err != nil {
		return false, err
	}
	return string(val) == strconv.FormatUint(seq, 10), nil
}

func (c *rawConn) apply(ctx context.Context, ops []Op, marker string, seq uint64) error {
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
	buf := append(c.buf[:0], "*1\r\n$5\r\nMULTI\r\n"...)
	var werr error
	for i := range ops {
		op := &ops[i]
		if op.Delta != 0 {
			buf = append(buf, "*3\r\n$6\r\nINCRBY\r\n"...)
			buf = appendName(buf, op)
			buf = appendBulkInt(buf, op.Delta)
		} else {
			buf = append(buf, "*2\r\n$3\r\nGET\r\n"...)
			buf = appendName(buf, op)
		}
		if op.ExpireAt != 0 {
			buf = append(buf, "*3\r\n$9\r\nPEXPIREAT\r\n"...)
			buf = appendName(buf, op)
			buf = appendBulkInt(buf, op.ExpireAt)
		}
		if len(buf) >= 256<<10 {
			if _, werr = c.c.Write(buf); werr != nil {
				break
			}
			buf = buf[:0]
		}
	}
	buf = append(buf, "*5\r\n$3\r\nSET\r\n"...)
	buf = appendBulk(buf, marker)
	buf = appendBulkInt(buf, int64(seq))
	buf = append(buf, "$2\r\nPX\r\n$7\r\n3600000\r\n*1\r\n$4\r\nEXEC\r\n"...)
	if werr == nil {
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
	// MULTI, then +QUEUED for every command, then EXEC's array.
	queued := 1 // the marker's SET
	for i := range ops {
		queued++
		if ops[i].ExpireAt != 0 {
			queued++
		}
	}
	for k := 0; k <= queued; k++ {
		line, err := c.line()
		if err != nil {
			return err
		}
		if len(line) == 0 || line[0] != '+' {
			return fmt.Errorf("%w %q in a transaction", errReply, line)
		}
	}
	line, err := c.line()
	if err != nil {
		return err
	}
	if n, err := parseInt(line, '*'); err != nil {
		return err
	} else if n != int64(queued) {
		return fmt.Errorf("%w: EXEC returned %d results for %d commands", errReply, n, queued)
	}
	for i := range ops {
		op := &ops[i]
		line, err := c.line()
		if err != nil {
			return err
		}
		switch {
		case op.Delta != 0: // INCRBY: an integer
			if op.Total, err = parseInt(line, ':'); err != nil {
				return fmt.Errorf("INCRBY %q: %w", op.Name(), err)
			}
		default: // GET: a bulk string holding an integer, or nil
			if op.Total, err = c.bulkInt(line); err != nil {
				return fmt.Errorf("GET %q: %w", op.Name(), err)
			}
		}
		if op.ExpireAt != 0 {
			line, err := c.line()
			if err != nil {
				return err
			}
			if _, err := parseInt(line, ':'); err != nil {
				return fmt.Errorf("PEXPIREAT %q: %w", op.Name(), err)
			}
		}
	}
	line, err = c.line() // the marker's SET: +OK
	if err != nil {
		return err
	}
	if len(line) == 0 || line[0] != '+' {
		return fmt.Errorf("%w %q for the sync marker", errReply, line)
	}
	return nil
}

// bulkInt reads the rest of a bulk-string reply that starts with line and
// parses it as an integer counter; nil reads as 0.
func (c *rawConn) bulkInt(line []byte) (int64, error) {
	n, err := parseInt(line, '$')
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, nil
	}
	if n > 20 {
		return 0, fmt.Errorf("a value of %d bytes is not a counter", n)
	}
	val, err := c.line()
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(string(val), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counter holds %q, not an integer", val)
	}
	return v, nil
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

// appendName appends the counter name of op as a bulk string, building
// no string.
func appendName(b []byte, op *Op) []byte {
	if op.Key != "" {
		return appendBulk(b, op.Key)
	}
	n := len(op.Base) + digits(op.WindowMs) + 1 + digits(op.ID)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, '\r', '\n')
	b = op.appendName(b)
	return append(b, '\r', '\n')
}

// digits returns the length of v in decimal.
func digits(v int64) int {
	n := 1
	if v < 0 {
		n, v = 2, -v
	}
	for v >= 10 {
		v /= 10
		n++
	}
	return n
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
