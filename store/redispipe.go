package store

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The Redis store's calls: lanes run at once, one pipeline per server, the
// scripts sent by hash or text, and WAIT for replicas.

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

// execScript runs a pipeline of one script call per item, and returns the
// commands, made by newCmd, whose type reads the reply (a
// *redis.IntSliceCmd reads an array of integers into one []int64 without
// boxing each value). args(i) gives item i's arguments, three free slots
// for the command's name, its body and the number of keys, then the keys
// and ARGV, and the number of keys. With whole, every call carries the
// script's text (EVAL); otherwise its hash (EVALSHA), and the calls that
// the server answers NOSCRIPT go again with the text in a second
// pipeline. It returns false when ctx ended before the server
// answered (Redis.bounded): every command then carries that error, and the
// arguments args returned belong to the client until it gives up. With
// inline, a client that ends calls at their deadline runs the pipelines on
// the caller's goroutine (Redis.bounded), and a ctx canceled before its
// deadline does not end them; otherwise they end when ctx is canceled too
// (Redis.boundedCancel).
func execScript[C redis.Cmder](s *Redis, ctx context.Context, inline bool, script luaScript, whole bool, items []int, args func(i int) ([]any, int), newCmd func(context.Context, ...any) C) ([]C, bool) {
	run := s.boundedCancel
	if inline {
		run = s.bounded
	}
	cmds := make([]C, len(items))
	argv := make([][]any, len(items))
	nkeys := make([]int, len(items))
	pipe := s.c.Pipeline()
	for k, i := range items {
		argv[k], nkeys[k] = args(i)
		if whole {
			cmds[k] = scriptCmd(ctx, pipe, "eval", script.src, argv[k], nkeys[k], newCmd)
		} else {
			cmds[k] = scriptCmd(ctx, pipe, "evalsha", script.Hash(), argv[k], nkeys[k], newCmd)
		}
	}
	wait := s.wait(ctx, pipe)
	s.calls.Add(1)
	if err := run(ctx, func() { _, _ = pipe.Exec(ctx) }); err != nil {
		return abandoned(ctx, cmds, err, newCmd), false
	}
	waited(s.o.WaitReplicas, wait, cmds)
	var retry []int
	for k, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, k)
		}
	}
	if len(retry) > 0 {
		pipe := s.c.Pipeline()
		again := make([]C, len(retry))
		for j, k := range retry {
			cmds[k] = scriptCmd(ctx, pipe, "eval", script.src, argv[k], nkeys[k], newCmd)
			again[j] = cmds[k]
		}
		wait := s.wait(ctx, pipe)
		s.calls.Add(1)
		if err := run(ctx, func() { _, _ = pipe.Exec(ctx) }); err != nil {
			for j, k := range retry {
				cmds[k] = abandoned(ctx, again[j:j+1], err, newCmd)[0]
			}
			return cmds, false
		}
		waited(s.o.WaitReplicas, wait, again)
	}
	return cmds, true
}

// abandoned replaces cmds, whose pipeline ctx's end cut short while the
// client still waits for its reply, by new commands failed with err: the
// client goes on writing the old ones.
func abandoned[C redis.Cmder](ctx context.Context, cmds []C, err error, newCmd func(context.Context, ...any) C) []C {
	for k := range cmds {
		cmds[k] = newCmd(ctx)
		cmds[k].SetErr(err)
	}
	return cmds
}

// scriptCmd queues on pipe the call of a script (name is "eval" with the
// script's text as body, or "evalsha" with its hash) with args (as
// execScript takes them, nkeys keys), as a command made by newCmd. It
// sets the three first elements of args.
func scriptCmd[C redis.Cmder](ctx context.Context, pipe redis.Pipeliner, name, body string, args []any, nkeys int, newCmd func(context.Context, ...any) C) C {
	args[0], args[1], args[2] = name, body, nkeys
	cmd := newCmd(ctx, args...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = pipe.Process(ctx, cmd)
	return cmd
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
// want replicas: a failover could lose what they wrote.
func waited[C redis.Cmder](want int, wait *redis.Cmd, cmds []C) {
	if wait == nil {
		return
	}
	n, err := wait.Int64()
	if err == nil && n >= int64(want) {
		return
	}
	var fail error = errNotReplicated{n, int64(want)}
	if err != nil {
		fail = fmt.Errorf("store: redis WAIT: %w", err)
	}
	for _, c := range cmds {
		if c.Err() == nil { // not an error reply, which wrote nothing
			c.SetErr(fail)
		}
	}
}

// perServer runs f for the items of each server (addrs[i] is item i's) at
// once, in order within a server. In a Redis Cluster a pipeline carries
// the calls of one master only: when the context ends during go-redis'
// retries for one node of a cluster pipeline (a hung or dead master), it
// sets the context's error on every command of the pipeline, including
// those that other masters ran and answered, which would put what healthy
// masters applied in doubt (a synchronous request is then counted twice),
// and open their circuits.
func (s *Redis) perServer(items []int, addrs []string, f func(items []int)) {
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
