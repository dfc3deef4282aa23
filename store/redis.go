package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store on a Redis server, Sentinel group or Cluster, through a
// go-redis client the caller owns (and closes): a *redis.Client (also
// redis.NewFailoverClient's), a *redis.ClusterClient, or any other
// redis.UniversalClient. Every command goes through the client, its
// connection pool, hooks and instrumentation; in Redis Cluster the client
// routes each batch to its slot's master and follows MOVED redirections.
//
// Push sends each Batch as one call of a Lua script that applies the batch
// at most once (see the package documentation) and Take sends its requests
// as one call of another (in a Redis Cluster, one per hash slot); all calls of a Push or Take go out in
// pipelines, up to Lanes of them at once (in a Redis Cluster, up to Lanes
// per master: a pipeline never spans masters, so that one failing master
// cannot fail the calls of another). A circuit breaker per server
// fails calls at once while a server does not answer (see RedisOptions).
// A Take call's arguments, key strings included, are built in buffers
// that are reused once Take returns: a hook that keeps a command's Args
// beyond its own call must copy them.
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
	// deadlines tells whether c ends a call at its context's deadline
	// (honorsDeadlines); otherwise bounded does.
	deadlines bool

	// Take calls go out on streams: a stream carries one pipeline at a
	// time, so that the take marker of a stream and group sees its calls
	// in order (a client's retry of a call comes before the next call).
	streamMu sync.Mutex
	streams  []*takeStream // free streams
	nstreams int

	calls atomic.Uint64

	// With a Redis Cluster client, the route (Router) of each hash slot:
	// the route number of the master the client's slot map last named for
	// it, 0 while unknown. learnt is set once the client has a slot map,
	// which Route then reads without I/O. A master's number is the least
	// one free when it first serves a slot, and is freed, with the
	// master's circuit, when it serves none (a new master's first call
	// notes every slot again: noteRoute): the numbers in use are as many
	// as the masters serving slots (one more while a master takes over
	// another's slots), whatever the addresses seen before.
	routeOf    []atomic.Uint32
	routeMu    sync.Mutex
	routeIdx   map[string]uint32 // the number of each master serving slots
	routeSlots []int             // slots per number (index 0 unused)
	routeAddr  []string          // the master of each number in use
	learnt     atomic.Bool
	sweeping   atomic.Bool // a sweep (noteRoute) is under way
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
	// 100ms and 5s, 1ms ≤ BreakerMin ≤ BreakerMax ≤ 1h; a negative
	// BreakerMin disables the breaker, and then BreakerMax must be 0.
	BreakerMin, BreakerMax time.Duration
	// WaitReplicas, when positive (at most 64), makes every call wait
	// until that many replicas have its writes (Redis WAIT), for at most
	// WaitTimeout (default 50ms, 1ms to 10s). A call that is not
	// acknowledged in time is in doubt: a push is sent again until a
	// master that its replicas follow applies it (exactly once, by its
	// marker), and a synchronous decision goes to the FailurePolicy. A
	// failover then loses nothing that a call reported applied, at the
	// cost of a replication round trip per call; and a master with fewer
	// replicas answering counts as failing. Not for Redis Cluster clients
	// (their pipelines cannot carry WAIT to the master that ran the
	// calls): NewRedis refuses it. Zero: no WAIT, and a failover loses
	// what the old master acknowledged but had not replicated (see
	// docs/failures.md).
	WaitReplicas int
	WaitTimeout  time.Duration
}

// NewRedis returns a store on the client c. It returns an error for
// options out of range. Every call ends at its context's deadline: when c
// does not end it there (go-redis' ContextTimeoutEnabled unset, its
// default), the store stops waiting and leaves the call to the client, in
// doubt. Every call but Take also ends when its context is canceled
// before its deadline, whatever the client's options.
func NewRedis(c redis.UniversalClient, o RedisOptions) (*Redis, error) {
	if v := reflect.ValueOf(c); c == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, errors.New("store: NewRedis: the client is nil")
	}
	if o.Lanes == 0 {
		o.Lanes = 4
	}
	if o.Lanes < 1 || o.Lanes > 64 {
		return nil, fmt.Errorf("store: RedisOptions.Lanes is %d, want 1 to 64", o.Lanes)
	}
	if o.BreakerMin < 0 && o.BreakerMax != 0 {
		return nil, fmt.Errorf("store: RedisOptions.BreakerMax is %v with BreakerMin %v: BreakerMax applies only with the breaker on (BreakerMin 0 or more)", o.BreakerMax, o.BreakerMin)
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
	if o.WaitTimeout != 0 && o.WaitReplicas == 0 {
		return nil, fmt.Errorf("store: RedisOptions.WaitTimeout is %v with WaitReplicas 0: WaitTimeout applies only with WaitReplicas set (1 or more)", o.WaitTimeout)
	}
	if o.WaitTimeout != 0 && (o.WaitTimeout < time.Millisecond || o.WaitTimeout > 10*time.Second) {
		return nil, fmt.Errorf("store: RedisOptions.WaitTimeout is %v, want 1ms to 10s", o.WaitTimeout)
	}
	if _, ok := c.(*redis.ClusterClient); ok && o.WaitReplicas > 0 {
		return nil, errors.New("store: RedisOptions.WaitReplicas is set, but a Redis Cluster client cannot send WAIT to the master that ran a pipeline; use it with a standalone or Sentinel (failover) client")
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Redis{c: c, o: o, node: hex.EncodeToString(id[:]), deadlines: honorsDeadlines(c)}
	s.cluster, _ = c.(*redis.ClusterClient)
	if s.cluster != nil {
		s.routeOf = make([]atomic.Uint32, Slots)
		s.routeIdx = map[string]uint32{}
		s.routeSlots, s.routeAddr = make([]int, 1), make([]string, 1)
	}
	if o.BreakerMin > 0 {
		s.breaker = newBreaker(o.BreakerMin, o.BreakerMax)
	}
	return s, nil
}

// honorsDeadlines reports whether c ends a command at its context's
// deadline (go-redis' ContextTimeoutEnabled). Without it, go-redis waits
// for a reply up to the client's ReadTimeout (3 s by default), whatever
// the context says.
func honorsDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// bounded runs f, which calls the server through the client with ctx, and
// returns nil once f returned, or an error wrapping ctx's when ctx ends
// first: a call ends at its context's deadline even when the client does
// not end it (see honorsDeadlines). f then goes on in its own goroutine
// until the client gives up: the caller must not read what f writes, nor
// reuse what f reads, once bounded returned an error.
func (s *Redis) bounded(ctx context.Context, f func()) error {
	return s.boundedBy(ctx, s.deadlines, f)
}

// boundedCancel is bounded for the calls that also end when ctx is
// canceled before its deadline (a limiter's Close cancels the sync loop's
// push and clock read, and its policy reload): a client that honors
// deadlines (ContextTimeoutEnabled) still waits for a blocked reply until
// the deadline or its ReadTimeout when the context is only canceled.
// These calls are few (one per sync cycle, policy reload or admin call):
// their goroutine costs nothing that counts. Take, one call per
// synchronous decision, uses bounded: a decision ends at its deadline.
func (s *Redis) boundedCancel(ctx context.Context, f func()) error {
	return s.boundedBy(ctx, false, f)
}

// boundedCall runs f under s.boundedCancel and returns what f returned,
// or boundedCancel's error when ctx ended first.
func boundedCall[T any](s *Redis, ctx context.Context, f func() (T, error)) (T, error) {
	var v T
	var err error
	if berr := s.boundedCancel(ctx, func() { v, err = f() }); berr != nil {
		var zero T
		return zero, berr
	}
	return v, err
}

// boundedBy is bounded, running f on the caller's goroutine when inline
// (the client ends the call at ctx's deadline itself).
func (s *Redis) boundedBy(ctx context.Context, inline bool, f func()) error {
	if inline || ctx.Done() == nil {
		f()
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		select {
		case <-done: // both: the answer wins
			return nil
		default:
		}
		return fmt.Errorf("store: redis: no answer before the call's deadline: %w", ctx.Err())
	}
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
	addr := c.Options().Addr
	s.noteRoute(g, addr)
	return addr
}

// Route implements Router: with a Redis Cluster client, the route of a
// key is the number of the master its hash slot had in the client's slot
// map at the last call for the slot or the last call that met a new
// master, or, for a slot no call went to yet,
// of the master the slot map names now: 1 and up, the least free when
// the master first serves a slot, and freed when it serves none, so that
// the numbers stay as many as the masters (one more while a master takes
// over another's slots); with any other client, or before the client read
// its slot map, 0. It sends nothing itself (reading the slot
// map may start go-redis' own background reload of it, as any call does).
func (s *Redis) Route(prefix, key string) int {
	if s.routeOf == nil {
		return 0
	}
	g := Slot(key)
	if r := s.routeOf[g].Load(); r != 0 || !s.learnt.Load() {
		return int(r)
	}
	// The client holds a slot map: reading it sends nothing.
	s.server(context.Background(), g)
	return int(s.routeOf[g].Load())
}

// noteRoute records that addr serves hash slot g, for Route. When addr is
// a master not seen before (a failover promoted it, or a resharding gave
// it slots), the client's slot map has changed: every slot noted before
// is noted again from the map, so that the slots no call has gone to
// since leave the masters the map no longer names, whose numbers and
// circuits are then freed (else, after many failovers, the numbers would
// pass the synchronous mode's queues and masters would share them). The
// sweep reads the client's map, without I/O, on the goroutine of the call
// that met the new master: a lookup per slot seen (about 2 ms with all
// 16,384), once per new master.
func (s *Redis) noteRoute(g int, addr string) {
	s.routeMu.Lock()
	r, ok := s.routeIdx[addr]
	if !ok {
		r = s.newRoute(addr)
	}
	if old := s.routeOf[g].Load(); old != r {
		s.routeOf[g].Store(r)
		s.routeSlots[r]++
		if old != 0 {
			s.dropSlot(old)
		}
	}
	s.routeMu.Unlock()
	if !s.learnt.Load() {
		s.learnt.Store(true)
	}
	if !ok && s.sweeping.CompareAndSwap(false, true) {
		for h := range s.routeOf {
			if h != g && s.routeOf[h].Load() != 0 && s.server(context.Background(), h) == "" {
				break // no map to read: the next call's new master sweeps
			}
		}
		s.sweeping.Store(false)
	}
}

// newRoute gives addr the least route number not in use and returns it.
// Call with routeMu held.
func (s *Redis) newRoute(addr string) uint32 {
	r := 1
	for r < len(s.routeSlots) && s.routeAddr[r] != "" {
		r++
	}
	if r == len(s.routeSlots) {
		s.routeSlots = append(s.routeSlots, 0)
		s.routeAddr = append(s.routeAddr, "")
	}
	s.routeAddr[r] = addr
	s.routeIdx[addr] = uint32(r)
	return uint32(r)
}

// dropSlot records that route r serves one slot less: when it serves none,
// its number is freed and its master's circuit forgotten (the slot map no
// longer names the master; if it names it again, it starts afresh). Call
// with routeMu held.
func (s *Redis) dropSlot(r uint32) {
	if s.routeSlots[r]--; s.routeSlots[r] > 0 {
		return
	}
	addr := s.routeAddr[r]
	delete(s.routeIdx, addr)
	s.routeAddr[r] = ""
	if s.breaker != nil {
		s.breaker.forget(addr)
	}
}

// allow reports whether a call to the server of group g may be sent, and
// returns the server's address (to send the call with the other calls to
// that server, and to report the outcome to). A call its lane sends is
// reported as sent at the lane's start, or, for the circuit's probe, no
// earlier than when allow let it through (sent.note).
func (s *Redis) allow(ctx context.Context, g int, sent *sentAt) (string, bool) {
	addr := s.server(ctx, g)
	if s.breaker == nil {
		return addr, true
	}
	at, ok := s.breaker.allowAt(addr)
	if ok && !at.IsZero() {
		sent.note(addr, at)
	}
	if !ok && s.cluster != nil {
		// The circuit of the master the slot map names is open. A refused
		// call reports no failure, so nothing else refreshes the map until
		// the circuit's probe has timed out, up to BreakerMax later; the
		// Cluster may have promoted a replica meanwhile, and the group
		// would wait for the dead master while the other nodes push to the
		// new one. go-redis reloads the map one call at a time, 200 ms
		// apart at most: once a new master serves the slot, the next call
		// goes to it.
		s.cluster.ReloadState(context.Background())
	}
	return addr, ok
}

// sentAt is when a lane's calls were sent, for the breaker: the lane's
// start, or for a server the lane probes, when the probe was allowed. A
// lane allows its calls one after another, so another lane's failure can
// open a circuit after the lane began and before it allows its probe; the
// probe's failure reported with the lane's start would count as part of
// the failure that opened the circuit, and leave the circuit waiting for
// a probe that has ended, refusing every call to the server from then on.
type sentAt struct {
	start  time.Time
	probes map[string]time.Time
}

func (s *sentAt) note(addr string, at time.Time) {
	if s.probes == nil {
		s.probes = map[string]time.Time{}
	}
	s.probes[addr] = at
}

// of returns when the lane's call to addr was sent.
func (s sentAt) of(addr string) time.Time {
	if at, ok := s.probes[addr]; ok && at.After(s.start) {
		return at
	}
	return s.start
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

// merge records in outcome the result of one call to addr: a failure of
// the connection wins over success and error replies.
func (s *Redis) merge(outcome map[string]error, addr string, err error) {
	if prev, ok := outcome[addr]; !ok || prev == nil || isReply(prev) {
		outcome[addr] = err
	}
}

// reportAll reports to the breaker, once per server, the outcome of a
// lane's pipeline.
func (s *Redis) reportAll(ctx context.Context, outcome map[string]error, sent sentAt) {
	for addr, err := range outcome {
		s.report(ctx, addr, sent.of(addr), err)
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
func cmdErr(cmd redis.Cmder) error {
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return nil
}

// slotOf returns the Redis Cluster slot that group g's markers hash to.
func (s *Redis) slotOf(g int) int { return g }

// Time implements Store. In a Redis Cluster it asks every master at once
// and returns the first answer, so that one dead shard does not make the
// whole store look down.
func (s *Redis) Time(ctx context.Context) (time.Time, error) {
	s.calls.Add(1)
	t, err := boundedCall(s, ctx, func() (time.Time, error) { return s.time(ctx) })
	if err != nil {
		return time.Time{}, fmt.Errorf("store: redis TIME: %w", err)
	}
	return t, nil
}

// timeSlotStep spaces the slots whose masters Time asks: every master
// serving a range of at least that many slots is asked.
const timeSlotStep = 128

// time is Time, unbounded. In a Cluster, a TIME sent through the cluster
// client goes to the master of a random slot; when that master is dead,
// go-redis spends its dial retries on it (4 × DialerRetryTimeout, 400 ms
// by default, for a refused connection) and the call's deadline can pass
// before another master is asked. The masters are therefore asked at
// once; the first answer wins.
func (s *Redis) time(ctx context.Context) (time.Time, error) {
	if s.cluster == nil {
		return s.c.Time(ctx).Result()
	}
	// The masters come from the client's slot map, without I/O:
	// ClusterClient.ForEachMaster first reloads the map from the nodes in
	// turn, which can spend the same dial retries on the dead one.
	var masters []*redis.Client
	for g := 0; g < Slots; g += timeSlotStep {
		c, err := s.cluster.MasterForKey(ctx, "{"+slotTag(g)+"}")
		if err != nil { // no slot map, and none could be loaded
			return time.Time{}, err
		}
		if !slices.Contains(masters, c) {
			masters = append(masters, c)
		}
	}
	// The calls are not canceled once one answers: a canceled wait for a
	// connection can fail other callers' commands to a healthy master
	// (measured: healthy synchronous requests in doubt in
	// TestFaultClusterMasterKilled). They end with ctx.
	type answer struct {
		t   time.Time
		err error
	}
	answers := make(chan answer, len(masters))
	for _, c := range masters {
		go func() {
			t, err := c.Time(ctx).Result()
			answers <- answer{t, err}
		}()
	}
	var first error
	for range masters {
		select {
		case a := <-answers:
			if a.err == nil {
				return a.t, nil
			}
			if first == nil {
				first = a.err
			}
		case <-ctx.Done():
			if first == nil {
				first = ctx.Err()
			}
			return time.Time{}, fmt.Errorf("no master answered: %w", first)
		}
	}
	return time.Time{}, fmt.Errorf("no master answered: %w", first)
}
