package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// The Redis store's Push: one push script call per batch, in one pipeline
// per lane and server.

// Push implements Store.
func (s *Redis) Push(ctx context.Context, batches []*Batch) error {
	if err := ctx.Err(); err != nil {
		for _, b := range batches {
			b.Status, b.Err = Failed, err
		}
		return err
	}
	addrs := make([]string, len(batches)) // by batch: each lane writes its own
	s.lanes(len(batches), func(i int) int { return batches[i].Group % s.o.Lanes }, func(items []int) {
		var sent sentAt
		sent.start = s.now()
		var send []int
		// One breaker decision per server and call: a circuit that opens or
		// half-opens during the call must not refuse an older batch of a
		// group and let a newer one through, which the older one's marker
		// would then take for applied.
		allowed := map[int]bool{}
		for _, i := range items {
			b := batches[i]
			ok, seen := allowed[b.Group]
			addr := ""
			if !seen {
				addr, ok = s.allow(ctx, b.Group, &sent)
				allowed[b.Group] = ok
			} else if ok {
				addr = s.server(ctx, b.Group)
			}
			if !ok {
				b.Status, b.Err = Failed, errOpen
				continue
			}
			addrs[i] = addr
			send = append(send, i)
		}
		at := sent // a copy the closure captures by value: sent would move to the heap
		s.perServer(send, addrs, func(send []int) {
			s.pushCalls(ctx, batches, send, addrs, at)
		})
	})
	return nil
}

// pushCalls sends batches[i] for every i in send as one pipeline, and sets
// their results; sent is when the lane sent them, for the breaker.
func (s *Redis) pushCalls(ctx context.Context, batches []*Batch, send []int, addrs []string, sent sentAt) {
	if len(send) == 0 {
		return
	}
	ttl := markerTTL.Milliseconds()
	// EVAL, not EVALSHA: a server without the script cached would fail
	// one batch and run the next of its group, out of order.
	orders := make([][]int, len(batches)) // by batch
	// A batch goes after the one before it of its group in the pipeline:
	// the script refuses it unless that one was applied. An error reply to
	// the older one (TRYAGAIN while its slot migrates) beside a newer one
	// applied would otherwise make the older one look applied, by the
	// marker, when it is sent again.
	prev := make([]uint64, len(batches)) // by batch
	last := map[int]uint64{}             // by group
	for _, i := range send {
		b := batches[i]
		prev[i], last[b.Group] = last[b.Group], b.Seq
	}
	cmds := s.exec(ctx, pushScript, true, send, func(i int) ([]string, []any) {
		b := batches[i]
		order, counts := pushOrder(b)
		orders[i] = order
		keys := pushKeys(markerKey(b.Prefix, 'm', s.slotOf(b.Group), b.Node), b, order)
		return keys, pushArgs(b, order, counts, ttl, prev[i])
	})
	outcome := make(map[string]error, 1)
	for k, i := range send {
		s.readPush(cmds[k], batches[i], orders[i])
		s.merge(outcome, addrs[i], cmdErr(cmds[k]))
	}
	s.reportAll(ctx, outcome, sent)
}

// pushOrder returns the order in which the push script gets b's ops (nil:
// as they are), and how many come first as counts: the ops on a window's
// count (Rate 0), then those on an arrival time, which alone take a rate
// argument.
func pushOrder(b *Batch) (order []int, counts int) {
	for j := range b.Ops {
		if b.Ops[j].Rate == 0 {
			counts++
		}
	}
	if counts == len(b.Ops) {
		return nil, counts
	}
	order = make([]int, 0, len(b.Ops))
	for j := range b.Ops {
		if b.Ops[j].Rate == 0 {
			order = append(order, j)
		}
	}
	for j := range b.Ops {
		if b.Ops[j].Rate != 0 {
			order = append(order, j)
		}
	}
	return order, counts
}

// pushArgs returns the push script's ARGV for b's ops in order (see
// pushScript), prev being the sequence number of the batch of b's group
// before b in its pipeline (0: none).
func pushArgs(b *Batch, order []int, counts int, ttl int64, prev uint64) []any {
	n := len(b.Ops)
	argv := make([]any, 4+n+n-counts+1)
	argv[len(argv)-1] = prev
	var maxd int64
	for k := range n {
		op := &b.Ops[opAt(order, k)]
		argv[4+k] = op.Delta
		if k >= counts {
			argv[4+n+k-counts] = op.Rate
		} else {
			maxd = max(maxd, op.Delta)
		}
	}
	argv[0], argv[1], argv[2], argv[3] = b.Seq, ttl, counts, maxd
	return argv
}

// opAt returns the index in the batch of the k-th op sent in order.
func opAt(order []int, k int) int {
	if order == nil {
		return k
	}
	return order[k]
}

// pushKeys returns the keys of b's script call: marker, then per op, in
// order (nil: as they are), CounterKey(b.Prefix, op.Counter). The
// counters' keys are parts of one string, built in one buffer of their
// exact length: a few allocations per batch instead of two per op, and no
// byte allocated twice.
func pushKeys(marker string, b *Batch, order []int) []string {
	n := 0
	for j := range b.Ops {
		n += len(b.Prefix) + 4 + base64.RawURLEncoding.EncodedLen(len(b.Ops[j].Key)) + counterLen(b.Ops[j].Counter)
	}
	buf := make([]byte, 0, n)
	ends := make([]int, len(b.Ops))
	for k := range b.Ops {
		op := &b.Ops[opAt(order, k)]
		buf = appendCounter(appendKeyBase(buf, b.Prefix, op.Key), op.Counter)
		ends[k] = len(buf)
	}
	// buf is never written again: the string shares its bytes.
	all := unsafe.String(unsafe.SliceData(buf), len(buf))
	keys := make([]string, 1+len(b.Ops))
	keys[0] = marker
	from := 0
	for j, end := range ends {
		keys[1+j], from = all[from:end], end
	}
	return keys
}

// readPush sets b's results from its script call, which had b's ops in
// order (see pushOrder).
func (s *Redis) readPush(cmd *redis.Cmd, b *Batch, order []int) {
	if err := cmdErr(cmd); err != nil {
		b.Status = InDoubt
		if isReply(err) {
			b.Status = Failed
		}
		b.Err = fmt.Errorf("store: redis push of %d counters: %w", len(b.Ops), err)
		return
	}
	vals, err := cmd.Slice()
	if err == nil && len(vals) != 1+len(b.Ops) {
		err = fmt.Errorf("push script replied %d values, want %d", len(vals), 1+len(b.Ops))
	}
	if err != nil {
		// The script ran to its end (a reply came), but the reply makes
		// no sense: the batch was applied; its totals are unknown.
		b.Status, b.Err = Applied, fmt.Errorf("store: redis push: %w", err)
		b.Totals = resize(b.Totals, len(b.Ops))
		clear(b.Totals)
		b.Refused = b.Refused[:0]
		return
	}
	b.Status, b.Err = Applied, nil
	b.Totals = resize(b.Totals, len(b.Ops))
	b.Refused = b.Refused[:0]
	for k := range b.Ops {
		j := opAt(order, k)
		switch v := vals[1+k].(type) {
		case int64:
			b.Totals[j] = v
			continue
		case error:
			b.Err = fmt.Errorf("store: redis counter %q: %w: %w", CounterKey(b.Prefix, b.Ops[j].Counter), ErrForeign, v)
		default:
			b.Err = fmt.Errorf("store: redis counter %q: the push script replied %T, want an integer", CounterKey(b.Prefix, b.Ops[j].Counter), v)
		}
		b.Totals[j] = 0
		if len(b.Refused) == 0 {
			b.Refused = resize(b.Refused, len(b.Ops))
			clear(b.Refused)
		}
		b.Refused[j] = true
	}
}
