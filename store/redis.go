package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store on a Redis server, Sentinel group or Cluster, through a
// go-redis client the caller owns (and closes). Apply is one pipeline of
// INCRBY, PEXPIREAT and GET commands; Take runs one Lua script call per
// request, all requests of a call in one pipeline. In Redis Cluster, every counter of
// a user key shares one hash slot, and go-redis splits pipelines by node.
//
// With a standalone client (*redis.Client), Apply writes its pipelines on
// at most two connections of its own, dialled with the client's options,
// in Redis's wire format with no allocation per counter: several times
// faster than go-redis pipelines for large sync cycles. Those pipelines
// bypass the client's hooks; ViaClient turns the fast path off. It is off
// by itself for clients with credential providers, OnConnect hooks or a
// client-side Limiter.
//
// Redis is safe for concurrent use. The zero value is not usable: create
// one with NewRedis.
type Redis struct {
	c      redis.UniversalClient
	raw    *rawPipe
	script *redis.Script
	calls  atomic.Uint64
}

// RedisOption configures NewRedis.
type RedisOption func(*Redis)

// ViaClient makes every command go through the go-redis client (its hooks,
// pool and instrumentation), at the cost of the fast sync path.
func ViaClient() RedisOption {
	return func(s *Redis) { s.raw = nil }
}

// NewRedis returns a store on the client c.
func NewRedis(c redis.UniversalClient, opts ...RedisOption) *Redis {
	s := &Redis{c: c, raw: newRawPipe(c), script: redis.NewScript(takeBatchScript)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Close closes the store's own connections (the fast sync path's), not the
// client. Calls after Close still work; they dial again when needed.
func (s *Redis) Close() error {
	if s.raw != nil {
		s.raw.close()
	}
	return nil
}

// Calls returns the number of round trips (pipelines and commands) sent.
func (s *Redis) Calls() uint64 { return s.calls.Load() }

// Apply implements Store.
func (s *Redis) Apply(ctx context.Context, ops []Op) error {
	if len(ops) == 0 {
		return nil
	}
	if s.raw != nil {
		s.calls.Add(1)
		return s.raw.apply(ctx, ops)
	}
	pipe := s.c.Pipeline()
	incr := make([]*redis.IntCmd, len(ops))
	get := make([]*redis.StringCmd, len(ops))
	for i := range ops {
		op := &ops[i]
		key := op.Name()
		if op.Delta != 0 {
			incr[i] = pipe.IncrBy(ctx, key, op.Delta)
		} else {
			get[i] = pipe.Get(ctx, key)
		}
		if op.ExpireAt != 0 {
			pipe.PExpireAt(ctx, key, time.UnixMilli(op.ExpireAt))
		}
	}
	s.calls.Add(1)
	cmds, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("store: redis pipeline of %d commands: %w", len(cmds), err)
	}
	for i := range ops {
		if incr[i] != nil {
			v, err := incr[i].Result()
			if err != nil {
				return fmt.Errorf("store: INCRBY %q: %w", ops[i].Name(), err)
			}
			ops[i].Total = v
			continue
		}
		v, err := get[i].Result()
		switch {
		case errors.Is(err, redis.Nil):
			ops[i].Total = 0
		case err != nil:
			return fmt.Errorf("store: GET %q: %w", ops[i].Name(), err)
		default:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("store: GET %q: counter holds %q, not an integer", ops[i].Name(), v)
			}
			ops[i].Total = n
		}
	}
	return nil
}

// Take implements Store. On the fast path (a standalone client), the whole
// batch is one script call on the store's own connection; otherwise one
// EVALSHA per request, all in one go-redis pipeline.
func (s *Redis) Take(ctx context.Context, reqs []*TakeRequest) error {
	if s.raw != nil {
		ok := reqs[:0:0]
		for _, r := range reqs {
			if r.Err = r.check(); r.Err == nil {
				ok = append(ok, r)
			}
		}
		if len(ok) == 0 {
			return nil
		}
		s.calls.Add(1)
		return s.raw.take(ctx, ok)
	}
	cmds := make([]*redis.Cmd, len(reqs))
	args := make([][]any, len(reqs))
	pipe := s.c.Pipeline()
	n := 0
	for i := range reqs {
		r := reqs[i]
		if err := r.check(); err != nil {
			r.Err = err
			continue
		}
		flags := 0
		if r.Peek {
			flags |= 1
		}
		if r.CountDenied {
			flags |= 2
		}
		// The batch script with a batch of one: in Redis Cluster, only one
		// request's keys are sure to share a hash slot.
		a := make([]any, 0, 5+4*len(r.Rules))
		a = append(a, 1, len(r.Rules), r.Cost, flags, r.NowUs)
		for j, rule := range r.Rules {
			fixed := 0
			if rule.Fixed {
				fixed = 1
			}
			a = append(a, rule.Limit, rule.WindowMs, fixed, r.ExpireAt[j])
		}
		args[i] = a
		cmds[i] = s.script.EvalSha(ctx, pipe, r.Keys, a...)
		n++
	}
	if n == 0 {
		return nil
	}
	s.calls.Add(1)
	_, err := pipe.Exec(ctx)
	if err != nil && !isNoScript(err) && !isReplyError(err) {
		return fmt.Errorf("store: redis pipeline of %d scripts: %w", n, err)
	}
	var retry []int
	for i, cmd := range cmds {
		if cmd != nil && isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		// The server does not have the script cached: send it whole once.
		pipe := s.c.Pipeline()
		for _, i := range retry {
			cmds[i] = s.script.Eval(ctx, pipe, reqs[i].Keys, args[i]...)
		}
		s.calls.Add(1)
		if _, err := pipe.Exec(ctx); err != nil && !isReplyError(err) {
			return fmt.Errorf("store: redis pipeline of %d scripts: %w", len(retry), err)
		}
	}
	for i, cmd := range cmds {
		if cmd != nil {
			reqs[i].Err = parseTake(cmd, reqs[i])
		}
	}
	return nil
}

func parseTake(cmd *redis.Cmd, r *TakeRequest) error {
	vals, err := cmd.Slice()
	if err != nil {
		return fmt.Errorf("store: take script: %w", err)
	}
	if len(vals) != 1+len(r.Counts) {
		return fmt.Errorf("store: take script replied %d values, want %d", len(vals), 1+len(r.Counts))
	}
	for i, v := range vals {
		n, ok := v.(int64)
		if !ok {
			return fmt.Errorf("store: take script reply %d is %T, want an integer", i, v)
		}
		if i == 0 {
			r.Allowed = n == 1
		} else {
			r.Counts[i-1] = n
		}
	}
	return nil
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// isReplyError reports whether err is an error reply from the server for
// one command (which the per-command checks report), as opposed to a
// failure of the connection.
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded)
}

// Time implements Store.
func (s *Redis) Time(ctx context.Context) (time.Time, error) {
	s.calls.Add(1)
	t, err := s.c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("store: redis TIME: %w", err)
	}
	return t, nil
}
