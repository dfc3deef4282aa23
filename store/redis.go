package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/local"
)

// Redis is a Store on a Redis server, Sentinel group or Cluster, through a
// go-redis client the caller owns (and closes): a *redis.Client (also
// redis.NewFailoverClient's), a *redis.ClusterClient, or any other
// redis.UniversalClient. Every command goes through the client, its
// connection pool, hooks and instrumentation; in Redis Cluster the client
// routes each batch to its slot's master and follows MOVED redirections.
//
// Push sends each Batch as one call of a Lua script that applies the batch
// at most once (see the package documentation) and Take sends each group's
// requests as one call of another; all calls of a Push or Take go out in
// pipelines, up to Lanes of them at once (in a Redis Cluster, up to Lanes
// per master: a pipeline never spans masters, so that one failing master
// cannot fail the calls of another). A circuit breaker per server
// fails calls at once while a server does not answer (see RedisOptions).
//
// Redis is safe for concurrent use. The zero value is not usable: create
// one with NewRedis.
type Redis struct {
	c       redis.UniversalClient
	cluster *redis.ClusterClient // nil unless c is one
	o       RedisOptions
	node    string // this store's identity in take markers
	seq     atomic.Uint64
	breaker *breaker

	// Take calls go out on streams: a stream carries one pipeline at a
	// time, so that the take marker of a stream and group sees its calls
	// in order (a client's retry of a call comes before the next call).
	streamMu sync.Mutex
	streams  []int // free stream ids
	nstreams int

	calls atomic.Uint64
}

// RedisOptions configures NewRedis. The zero value selects the defaults.
type RedisOptions struct {
	// Lanes is how many pipelines a Push or Take sends at once, each on
	// its own connection: 1 to 64, default 4. In a standalone or Sentinel
	// deployment it is also the number of groups.
	Lanes int
	// BreakerMin and BreakerMax bound the time calls to a server fail
	// without being sent after it stopped answering: a failure opens the
	// circuit for BreakerMin (the calls already on their way that fail
	// with it count as one failure), each failed probe doubles it up to
	// BreakerMax. A call its caller canceled counts for nothing. Defaults
	// 100ms and 5s; a negative BreakerMin disables the breaker.
	BreakerMin, BreakerMax time.Duration
	// WaitReplicas, when positive, makes every call wait until that many
	// replicas have its writes (Redis WAIT), for at most WaitTimeout
	// (default 50ms, 1ms to 10s). A call that is not acknowledged in time
	// is in doubt: a push is sent again until a master that its replicas
	// follow applies it (exactly once, by its marker), and a synchronous
	// decision goes to the FailurePolicy. A failover then loses nothing
	// that a call reported applied, at the cost of a replication round
	// trip per call; and a master with fewer replicas answering counts as
	// failing. Not for Redis Cluster clients (their pipelines cannot carry
	// WAIT to the master that ran the calls): NewRedis refuses it. Zero:
	// no WAIT, and a failover loses what the old master acknowledged but
	// had not replicated (see docs/failures.md).
	WaitReplicas int
	WaitTimeout  time.Duration
}

// NewRedis returns a store on the client c. It returns an error for
// options out of range.
func NewRedis(c redis.UniversalClient, o RedisOptions) (*Redis, error) {
	if c == nil {
		return nil, errors.New("store: NewRedis: the client is nil")
	}
	if o.Lanes == 0 {
		o.Lanes = 4
	}
	if o.Lanes < 1 || o.Lanes > 64 {
		return nil, fmt.Errorf("store: RedisOptions.Lanes is %d, want 1 to 64", o.Lanes)
	}
	if o.BreakerMin == 0 {
		o.BreakerMin = 100 * time.Millisecond
	}
	if o.BreakerMax == 0 {
		o.BreakerMax = 5 * time.Second
	}
	if o.BreakerMin > 0 && (o.BreakerMin < time.Millisecond || o.BreakerMax < o.BreakerMin || o.BreakerMax > time.Hour) {
		return nil, fmt.Errorf("store: RedisOptions.BreakerMin is %v and BreakerMax %v, want 1ms ≤ BreakerMin ≤ BreakerMax ≤ 1h", o.BreakerMin, o.BreakerMax)
	}
	if o.WaitReplicas < 0 || o.WaitReplicas > 64 {
		return nil, fmt.Errorf("store: RedisOptions.WaitReplicas is %d, want 0 to 64", o.WaitReplicas)
	}
	if o.WaitReplicas > 0 && o.WaitTimeout == 0 {
		o.WaitTimeout = 50 * time.Millisecond
	}
	if o.WaitTimeout != 0 && (o.WaitReplicas == 0 || o.WaitTimeout < time.Millisecond || o.WaitTimeout > 10*time.Second) {
		return nil, fmt.Errorf("store: RedisOptions.WaitTimeout is %v, want 1ms to 10s with WaitReplicas set", o.WaitTimeout)
	}
	if _, ok := c.(*redis.ClusterClient); ok && o.WaitReplicas > 0 {
		return nil, errors.New("store: RedisOptions.WaitReplicas is set, but a Redis Cluster client cannot send WAIT to the master that ran a pipeline; use it with a standalone or Sentinel (failover) client")
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Redis{c: c, o: o, node: hex.EncodeToString(id[:])}
	s.cluster, _ = c.(*redis.ClusterClient)
	if o.BreakerMin > 0 {
		s.breaker = newBreaker(o.BreakerMin, o.BreakerMax)
	}
	return s, nil
}

// Calls returns the number of pipelines and commands sent.
func (s *Redis) Calls() uint64 { return s.calls.Load() }

// Group implements Store: the key's hash slot in a Redis Cluster, a lane
// otherwise.
func (s *Redis) Group(key string) int {
	if s.cluster != nil {
		return Slot(key)
	}
	return Slot(key) % s.o.Lanes
}

// server returns the address of the server holding group g, or "" when
// it cannot be known without I/O.
func (s *Redis) server(ctx context.Context, g int) string {
	if s.cluster == nil {
		return "master"
	}
	c, err := s.cluster.MasterForKey(ctx, "{"+slotTag(g)+"}")
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// allow reports whether a call to the server of group g may be sent, and
// returns the server's address (to send the call with the other calls to
// that server, and to report the outcome to).
func (s *Redis) allow(ctx context.Context, g int) (string, bool) {
	addr := s.server(ctx, g)
	if s.breaker == nil {
		return addr, true
	}
	return addr, s.breaker.allow(addr)
}

// report reports to the breaker the outcome of a call to addr sent at
// sent. A call that failed because its caller canceled it (Close cancels
// the sync loop's push under way, for example) says nothing about the
// server; go-redis reports it as a broken connection, so ctx tells.
func (s *Redis) report(ctx context.Context, addr string, sent time.Time, err error) {
	failed := err != nil && !isReply(err)
	canceled := failed && errors.Is(ctx.Err(), context.Canceled)
	if s.breaker != nil {
		if canceled {
			s.breaker.abandon(addr)
		} else {
			s.breaker.done(addr, sent, !failed)
		}
	}
	if failed && !canceled && s.cluster != nil {
		// A node may be gone: refresh the slot map now rather than at
		// go-redis' next periodic reload.
		s.cluster.ReloadState(context.Background())
	}
}

// errOpen fails a call not sent because its server's circuit is open.
var errOpen = fmt.Errorf("store: redis server not answering, call not sent (circuit open): %w", ErrUnavailable)

// isReply reports whether err is an error reply from the server, which
// means the command did not run, as opposed to a failure of the
// connection, after which it may have run.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// lanes runs f for every lane of items (in order within a lane), the lanes
// at once; lane(i) is item i's lane.
func (s *Redis) lanes(n int, lane func(i int) int, f func(items []int)) {
	per := make([][]int, s.o.Lanes)
	for i := range n {
		l := lane(i)
		per[l] = append(per[l], i)
	}
	var wg sync.WaitGroup
	var last []int
	for _, items := range per {
		if len(items) == 0 {
			continue
		}
		if last != nil {
			wg.Add(1)
			go func(items []int) {
				defer wg.Done()
				f(items)
			}(last)
		}
		last = items
	}
	if last != nil {
		f(last) // the last lane on this goroutine: one call waits for no scheduling
	}
	wg.Wait()
}

// exec runs a pipeline of one script call per item, and returns the
// commands. With whole, every call carries the script's text (EVAL);
// otherwise its hash (EVALSHA), and the calls that the server answers
// NOSCRIPT go again with the text in a second pipeline.
func (s *Redis) exec(ctx context.Context, script *redis.Script, whole bool, items []int, args func(i int) ([]string, []any)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(items))
	keys := make([][]string, len(items))
	argv := make([][]any, len(items))
	pipe := s.c.Pipeline()
	for k, i := range items {
		keys[k], argv[k] = args(i)
		if whole {
			cmds[k] = script.Eval(ctx, pipe, keys[k], argv[k]...)
		} else {
			cmds[k] = script.EvalSha(ctx, pipe, keys[k], argv[k]...)
		}
	}
	wait := s.wait(ctx, pipe)
	s.calls.Add(1)
	_, _ = pipe.Exec(ctx)
	s.waited(wait, cmds)
	var retry []int
	for k, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, k)
		}
	}
	if len(retry) > 0 {
		pipe := s.c.Pipeline()
		again := make([]*redis.Cmd, len(retry))
		for j, k := range retry {
			cmds[k] = script.Eval(ctx, pipe, keys[k], argv[k]...)
			again[j] = cmds[k]
		}
		wait := s.wait(ctx, pipe)
		s.calls.Add(1)
		_, _ = pipe.Exec(ctx)
		s.waited(wait, again)
	}
	return cmds
}

// wait appends WAIT to pipe when RedisOptions.WaitReplicas is set.
func (s *Redis) wait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	if s.o.WaitReplicas == 0 {
		return nil
	}
	return pipe.Do(ctx, "wait", s.o.WaitReplicas, s.o.WaitTimeout.Milliseconds())
}

// errNotReplicated marks a call whose writes too few replicas acknowledged.
type errNotReplicated struct{ got, want int64 }

func (e errNotReplicated) Error() string {
	return fmt.Sprintf("store: redis: %d of %d replicas acknowledged the call's writes (RedisOptions.WaitReplicas): in doubt", e.got, e.want)
}

// waited puts the calls of a pipeline in doubt when its WAIT did not see
// enough replicas: a failover could lose what they wrote.
func (s *Redis) waited(wait *redis.Cmd, cmds []*redis.Cmd) {
	if wait == nil {
		return
	}
	n, err := wait.Int64()
	if err == nil && n >= int64(s.o.WaitReplicas) {
		return
	}
	var fail error = errNotReplicated{n, int64(s.o.WaitReplicas)}
	if err != nil {
		fail = fmt.Errorf("store: redis WAIT: %w", err)
	}
	for _, c := range cmds {
		if c.Err() == nil { // not an error reply, which wrote nothing
			c.SetErr(fail)
		}
	}
}

// Push implements Store.
func (s *Redis) Push(ctx context.Context, batches []*Batch) error {
	if err := ctx.Err(); err != nil {
		for _, b := range batches {
			b.Status, b.Err = Failed, err
		}
		return err
	}
	s.lanes(len(batches), func(i int) int { return batches[i].Group % s.o.Lanes }, func(items []int) {
		sent := s.now()
		var send []int
		addrs := make(map[int]string, len(items))
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
				addr, ok = s.allow(ctx, b.Group)
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
		s.perServer(send, addrs, func(send []int) {
			s.pushCalls(ctx, batches, send, addrs, sent)
		})
	})
	return nil
}

// pushCalls sends batches[i] for every i in send as one pipeline, and sets
// their results; sent is when the lane began, for the breaker.
func (s *Redis) pushCalls(ctx context.Context, batches []*Batch, send []int, addrs map[int]string, sent time.Time) {
	if len(send) == 0 {
		return
	}
	ttl := markerTTL.Milliseconds()
	// EVAL, not EVALSHA: a server without the script cached would fail
	// one batch and run the next of its group, out of order.
	cmds := s.exec(ctx, pushScript, true, send, func(i int) ([]string, []any) {
		b := batches[i]
		keys := make([]string, 1+len(b.Ops))
		keys[0] = markerKey(b.Prefix, 'm', s.slotOf(b.Group), b.Node)
		argv := make([]any, 2+2*len(b.Ops))
		argv[0], argv[1] = b.Seq, ttl
		for j := range b.Ops {
			op := &b.Ops[j]
			keys[1+j] = CounterKey(b.Prefix, op.Counter)
			argv[2+2*j], argv[3+2*j] = op.Delta, op.Rate
		}
		return keys, argv
	})
	outcome := make(map[string]error, 1)
	for k, i := range send {
		s.readPush(cmds[k], batches[i])
		s.merge(outcome, addrs[i], cmdErr(cmds[k]))
	}
	s.reportAll(ctx, outcome, sent)
}

// perServer runs f for the items of each server (addrs[i] is item i's) at
// once, in order within a server. In a Redis Cluster a pipeline carries
// the calls of one master only: when the context ends during go-redis'
// retries for one node of a cluster pipeline (a hung or dead master), it
// sets the context's error on every command of the pipeline, including
// those that other masters ran and answered, which would put what healthy
// masters applied in doubt (a synchronous request is then counted twice),
// and open their circuits.
func (s *Redis) perServer(items []int, addrs map[int]string, f func(items []int)) {
	if s.cluster == nil {
		f(items)
		return
	}
	var order []string
	per := map[string][]int{}
	for _, i := range items {
		a := addrs[i]
		if _, ok := per[a]; !ok {
			order = append(order, a)
		}
		per[a] = append(per[a], i)
	}
	if len(order) == 1 {
		f(items)
		return
	}
	var wg sync.WaitGroup
	for _, a := range order {
		wg.Go(func() { f(per[a]) })
	}
	wg.Wait()
}

// merge records in outcome the result of one call to addr: a failure of
// the connection wins over success and error replies.
func (s *Redis) merge(outcome map[string]error, addr string, err error) {
	if prev, ok := outcome[addr]; !ok || prev == nil || isReply(prev) {
		outcome[addr] = err
	}
}

// reportAll reports to the breaker, once per server, the outcome of a
// pipeline sent at sent.
func (s *Redis) reportAll(ctx context.Context, outcome map[string]error, sent time.Time) {
	for addr, err := range outcome {
		s.report(ctx, addr, sent, err)
	}
}

// now returns the breaker's time (zero without a breaker).
func (s *Redis) now() time.Time {
	if s.breaker == nil {
		return time.Time{}
	}
	return s.breaker.now()
}

// cmdErr returns the error of the call itself, not of its reply's
// elements.
func cmdErr(cmd *redis.Cmd) error {
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return nil
}

// slotOf returns the Redis Cluster slot that group g's markers hash to.
func (s *Redis) slotOf(g int) int { return g }

// readPush sets b's results from its script call.
func (s *Redis) readPush(cmd *redis.Cmd, b *Batch) {
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
		return
	}
	b.Status, b.Err = Applied, nil
	b.Totals = resize(b.Totals, len(b.Ops))
	for j := range b.Ops {
		switch v := vals[1+j].(type) {
		case int64:
			b.Totals[j] = v
		case error:
			b.Totals[j] = 0
			b.Err = fmt.Errorf("store: redis counter %q: %w", CounterKey(b.Prefix, b.Ops[j].Counter), v)
		default:
			b.Totals[j] = 0
			b.Err = fmt.Errorf("store: redis counter %q: the push script replied %T, want an integer", CounterKey(b.Prefix, b.Ops[j].Counter), v)
		}
	}
}

// Take implements Store. The requests of one group and one set of rules
// go out as one script call.
func (s *Redis) Take(ctx context.Context, reqs []*TakeRequest) error {
	if err := ctx.Err(); err != nil {
		for _, r := range reqs {
			r.Status, r.Err = Failed, err
		}
		return err
	}
	type call struct {
		group int
		reqs  []*TakeRequest
		seq   uint64
	}
	type callKey struct {
		group  int
		prefix string
		rules  *local.Rule
		n      int
	}
	var calls []*call
	index := map[callKey]*call{}
	for _, r := range reqs {
		if err := r.check(); err != nil {
			r.Status, r.Err = Failed, err
			continue
		}
		g := s.Group(r.Key)
		k := callKey{g, r.Prefix, &r.Rules[0], len(r.Rules)}
		c := index[k]
		if c == nil {
			c = &call{group: g}
			index[k] = c
			calls = append(calls, c)
		}
		c.reqs = append(c.reqs, r)
	}
	ttl := int64(time.Minute / time.Millisecond)
	s.lanes(len(calls), func(i int) int { return calls[i].group % s.o.Lanes }, func(items []int) {
		sent := s.now()
		stream := s.stream()
		defer s.releaseStream(stream)
		node := s.node + "." + strconv.Itoa(stream)
		var send []int
		addrs := make(map[int]string, len(items))
		for _, i := range items {
			c := calls[i]
			addr, ok := s.allow(ctx, c.group)
			if !ok {
				for _, r := range c.reqs {
					r.Status, r.Err = Failed, errOpen
				}
				continue
			}
			addrs[i] = addr
			c.seq = s.seq.Add(1)
			send = append(send, i)
		}
		s.perServer(send, addrs, func(send []int) {
			if len(send) == 0 {
				return
			}
			cmds := s.exec(ctx, takeScript, false, send, func(i int) ([]string, []any) {
				c := calls[i]
				return takeArgs(markerKey(c.reqs[0].Prefix, 't', s.slotOf(c.group), node), c.seq, ttl, c.reqs)
			})
			outcome := make(map[string]error, 1)
			for k, i := range send {
				readTake(cmds[k], calls[i].reqs)
				s.merge(outcome, addrs[i], cmdErr(cmds[k]))
			}
			s.reportAll(ctx, outcome, sent)
		})
	})
	return nil
}

// stream returns a free stream id.
func (s *Redis) stream() int {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	if n := len(s.streams); n > 0 {
		id := s.streams[n-1]
		s.streams = s.streams[:n-1]
		return id
	}
	s.nstreams++
	return s.nstreams - 1
}

func (s *Redis) releaseStream(id int) {
	s.streamMu.Lock()
	s.streams = append(s.streams, id)
	s.streamMu.Unlock()
}

// kindCode returns the take script's code of a rule's kind.
func kindCode(k local.Kind) int {
	switch k {
	case local.Sliding:
		return 0
	case local.Fixed:
		return 1
	case local.Buckets:
		return 2
	case local.Log:
		return 3
	}
	return 4
}

// takeArgs returns the take script's keys and arguments for reqs, which
// share their rules.
func takeArgs(marker string, seq uint64, ttl int64, reqs []*TakeRequest) ([]string, []any) {
	rules := reqs[0].Rules
	logCap, longLog := int64(0), int64(0)
	for i := range rules {
		if rules[i].Kind() == local.Log {
			logCap, longLog = max(logCap, rules[i].Limit()), max(longLog, rules[i].Window().Microseconds())
		}
	}
	keys := append(make([]string, 0, 1+3*len(rules)*len(reqs)), marker)
	argv := make([]any, 0, 5+5*len(rules)+3*len(reqs))
	argv = append(argv, seq, ttl, reqs[0].Deadline, len(reqs), len(rules))
	for i := range rules {
		r := &rules[i]
		w, span := r.Counter()
		var wus, param int64 = w.Microseconds(), span
		switch r.Kind() {
		case local.Log:
			wus, param = r.Window().Microseconds(), logCap
		case local.GCRA, local.Leaky:
			wus, param = r.Interval().Microseconds(), r.Burst()
		}
		argv = append(argv, kindCode(r.Kind()), r.Limit(), wus, param, longLog)
	}
	for _, q := range reqs {
		flags := 0
		if q.Peek {
			flags |= 1
		}
		if q.CountDenied {
			flags |= 2
		}
		argv = append(argv, q.Cost, flags, q.Now)
		for i := range rules {
			r := &rules[i]
			switch r.Kind() {
			case local.Log:
				keys = append(keys, LogKey(q.Prefix, q.Key))
			case local.GCRA, local.Leaky:
				keys = append(keys, CounterKey(q.Prefix, CounterOf(r, q.Key, 0)))
			default:
				w, span := r.Counter()
				id := q.Now / w.Microseconds()
				switch r.Kind() {
				case local.Buckets:
					for j := range span {
						keys = append(keys, CounterKey(q.Prefix, CounterOf(r, q.Key, id-span+1+j)))
					}
				case local.Fixed:
					keys = append(keys, CounterKey(q.Prefix, CounterOf(r, q.Key, id)))
				default:
					keys = append(keys, CounterKey(q.Prefix, CounterOf(r, q.Key, id)), CounterKey(q.Prefix, CounterOf(r, q.Key, id-1)))
				}
			}
		}
	}
	return keys, argv
}

// readTake sets the results of reqs from their script call.
func readTake(cmd *redis.Cmd, reqs []*TakeRequest) {
	fail := func(st Status, err error) {
		for _, r := range reqs {
			r.Status, r.Err = st, err
		}
	}
	if err := cmdErr(cmd); err != nil {
		st := InDoubt
		if isReply(err) {
			st = Failed
		}
		fail(st, fmt.Errorf("store: redis take of %d requests: %w", len(reqs), err))
		return
	}
	vals, err := cmd.Int64Slice()
	if err != nil || len(vals) == 0 {
		fail(InDoubt, fmt.Errorf("store: redis take: unreadable reply: %v", err))
		return
	}
	switch vals[0] {
	case 2:
		fail(Failed, errDeadline)
		return
	case 3:
		fail(InDoubt, errors.New("store: redis take: a later call overwrote this call's outcome"))
		return
	}
	at := 1
	next := func() int64 {
		if at >= len(vals) {
			at++
			return 0
		}
		at++
		return vals[at-1]
	}
	for _, r := range reqs {
		r.Counts = resize(r.Counts, len(r.Rules))
		r.Allowed = next() == 1
		for j := range r.Rules {
			rule := &r.Rules[j]
			w, span := rule.Counter()
			el := r.Now % w.Microseconds() * 1000
			var c local.Counts
			switch rule.Kind() {
			case local.Sliding:
				c = local.Counts{Cur: next(), Prev: next(), Elapsed: el}
			case local.Fixed:
				c = local.Counts{Cur: next(), Elapsed: el}
			case local.Buckets:
				c = local.Counts{Buckets: make([]int64, span), Elapsed: el}
				for k := range c.Buckets {
					c.Buckets[k] = next()
				}
			case local.Log:
				c = local.Counts{Cur: next(), Expire: next() * 1000, Reset: next() * 1000}
			default:
				c = local.Counts{Tat: next() * 1000}
			}
			r.Counts[j] = c
		}
		r.Status, r.Err = Applied, nil
	}
	if at != len(vals) {
		fail(InDoubt, fmt.Errorf("store: redis take script replied %d values, want %d", len(vals), at))
	}
}

// Time implements Store. In a Redis Cluster it asks the masters in turn
// until one answers, so that one dead shard does not make the whole store
// look down.
func (s *Redis) Time(ctx context.Context) (time.Time, error) {
	s.calls.Add(1)
	t, err := s.c.Time(ctx).Result()
	if err == nil {
		return t, nil
	}
	if s.cluster == nil || ctx.Err() != nil {
		return time.Time{}, fmt.Errorf("store: redis TIME: %w", err)
	}
	var mu sync.Mutex
	first := err
	var got time.Time
	errFound := errors.New("found")
	_ = s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		done := !got.IsZero()
		mu.Unlock()
		if done {
			return nil
		}
		t, err := c.Time(ctx).Result()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			return nil
		}
		if got.IsZero() {
			got = t
		}
		return errFound
	})
	if !got.IsZero() {
		return got, nil
	}
	return time.Time{}, fmt.Errorf("store: redis TIME: no master answered: %w", first)
}
