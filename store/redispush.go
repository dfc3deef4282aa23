package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// The Redis store's Push: one push script call per batch, or per several
// small batches (many slots' batches in one call in a Redis Cluster), in
// one pipeline per lane and server.

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
	counts := make([]int, len(batches))   // by batch: its count ops
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
	calls := pushCallsOf(batches, send)
	each := make([]int, len(calls))
	for c := range each {
		each[c] = c
	}
	cmds, _ := execScript(s, ctx, false, pushScript, true, each, func(c int) ([]any, int) {
		for _, i := range calls[c] {
			orders[i], counts[i] = pushOrder(batches[i])
		}
		return s.pushCall(batches, calls[c], orders, counts, prev, ttl)
	}, redis.NewCmd)
	outcome := make(map[string]error, 1)
	moved := false
	for k, items := range calls {
		err := cmdErr(cmds[k])
		var replies []any
		if err == nil {
			if replies, err = cmds[k].Slice(); err == nil && len(replies) != len(items) {
				err = fmt.Errorf("push script replied for %d batches, want %d", len(replies), len(items))
			}
			if err != nil {
				// The script ran to its end (a reply came), but the reply
				// makes no sense: the batches were applied; their totals
				// are unknown.
				for _, i := range items {
					unknownTotals(batches[i], err)
				}
				s.merge(outcome, addrs[items[0]], nil)
				continue
			}
		}
		for x, i := range items {
			var reply any
			if replies != nil {
				reply = replies[x]
			}
			if readPush(batches[i], orders[i], err, reply) && x > 0 {
				moved = true
			}
		}
		s.merge(outcome, addrs[items[0]], err)
	}
	if moved && s.cluster != nil {
		// A batch after a call's first was refused: its slot may be served
		// elsewhere now, which only the slot map's next reload tells.
		s.cluster.ReloadState(ctx)
	}
	s.reportAll(ctx, outcome, sent)
}

// pushCall returns the arguments of the push script call of batches[i]
// for every i in items, b's ops in orders[i] (see pushOrder), counts[i] of
// them counts, prev[i] the seq of the batch of its group before it in the
// pipeline, as execScript takes them (in one slice of its exact length),
// and the number of keys: the first batch's keys are the call's, the
// others' go in ARGV.
func (s *Redis) pushCall(batches []*Batch, items []int, orders [][]int, counts []int, prev []uint64, ttl int64) ([]any, int) {
	n := 3 + 1 // the free slots, the TTL
	for _, i := range items {
		ops := len(batches[i].Ops)
		n += 1 + ops + 5 + 2*ops - counts[i] // keys, header, deltas, rates
	}
	args := make([]any, 3, n)
	nkeys := 0
	for x, i := range items {
		b := batches[i]
		keys := pushKeys(markerKey(b.Prefix, 'm', s.slotOf(b.Group), b.Node), b, orders[i])
		if x == 0 {
			args = append(appendKeys(args, keys), ttl)
			nkeys, keys = len(keys), nil
		}
		args = appendPushArgs(args, b, orders[i], counts[i], prev[i], keys)
	}
	return args, nkeys
}

// maxCallOps bounds the ops of the batches that share a push script call
// (a batch with more goes alone): the calls of many small batches (a
// Cluster's slots) cost one call's overhead, and no call holds the
// server much longer than one full batch's.
const maxCallOps = 512

// pushCallsOf splits send, a server's batches in pipeline order, into
// script calls, each a part of send.
func pushCallsOf(batches []*Batch, send []int) [][]int {
	calls := make([][]int, 0, 1)
	from, ops := 0, 0
	for k, i := range send {
		n := len(batches[i].Ops)
		if k > from && ops+n > maxCallOps {
			calls, from, ops = append(calls, send[from:k]), k, 0
		}
		ops += n
	}
	return append(calls, send[from:])
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

// appendPushArgs appends to argv the push script's arguments for b's ops
// in order (see pushScript), prev being the sequence number of the batch
// of b's group before b in its pipeline (0: none), and keys b's keys when
// b is not the call's first batch (nil when it is).
func appendPushArgs(argv []any, b *Batch, order []int, counts int, prev uint64, keys []string) []any {
	n := len(b.Ops)
	h := len(argv)
	argv = appendKeys(append(argv, n, b.Seq, counts, int64(0), prev), keys)
	var maxd int64
	for k := range n {
		op := &b.Ops[opAt(order, k)]
		argv = append(argv, op.Delta)
		if k < counts {
			maxd = max(maxd, op.Delta)
		}
	}
	for k := counts; k < n; k++ {
		argv = append(argv, b.Ops[opAt(order, k)].Rate)
	}
	argv[h+3] = maxd
	return argv
}

// appendKeys appends to args a pointer to each of keys, which boxes
// without allocating: a call costs the same few allocations whatever its
// number of keys.
func appendKeys(args []any, keys []string) []any {
	for i := range keys {
		args = append(args, &keys[i])
	}
	return args
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
	keys := make([]string, 1+len(b.Ops))
	keys[0] = marker
	for k := range b.Ops {
		op := &b.Ops[opAt(order, k)]
		from := len(buf)
		buf = appendCounter(appendKeyBase(buf, b.Prefix, op.Key), op.Counter)
		// The bytes a key took are never written again (an append past
		// the capacity would copy them, not move them): the string
		// shares them.
		keys[1+k] = unsafe.String(&buf[from], len(buf)-from)
	}
	return keys
}

// unknownTotals sets b's results for a batch the store applied whose
// totals are unknown, err saying why.
func unknownTotals(b *Batch, err error) {
	b.Status, b.Err = Applied, fmt.Errorf("store: redis push: %w", err)
	b.Totals = resize(b.Totals, len(b.Ops))
	clear(b.Totals)
	b.Refused = b.Refused[:0]
}

// readPush sets b's results from its script call, which had b's ops in
// order (see pushOrder): err is the call's error, reply the script's reply
// for b. It reports whether the script refused b whole.
func readPush(b *Batch, order []int, err error, reply any) (refused bool) {
	if err == nil {
		if e, ok := reply.(error); ok {
			err, refused = e, true
		}
	}
	if err != nil {
		b.Status = InDoubt
		if isReply(err) {
			b.Status = Failed
		}
		b.Err = fmt.Errorf("store: redis push of %d counters: %w", len(b.Ops), err)
		return refused
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) != 1+len(b.Ops) {
		// The script ran to its end (a reply came), but the reply makes
		// no sense: the batch was applied; its totals are unknown.
		unknownTotals(b, fmt.Errorf("push script replied %T of %d values for a batch, want %d", reply, len(vals), 1+len(b.Ops)))
		return false
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
	return false
}
