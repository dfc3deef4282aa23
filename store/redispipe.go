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

// exec runs a pipeline of one script call per item, and returns the
// commands. With whole, every call carries the script's text (EVAL);
// otherwise its hash (EVALSHA), and the calls that the server answers
// NOSCRIPT go again with the text in a second pipeline.
func (s *Redis) exec(ctx context.Context, script luaScript, whole bool, items []int, args func(i int) ([]string, []any)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(items))
	keys := make([][]string, len(items))
	argv := make([][]any, len(items))
	pipe := s.c.Pipeline()
	for k, i := range items {
		keys[k], argv[k] = args(i)
		if whole {
			cmds[k] = scriptCmd(ctx, pipe, "eval", script.src, keys[k], argv[k])
		} else {
			cmds[k] = scriptCmd(ctx, pipe, "evalsha", script.Hash(), keys[k], argv[k])
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
			cmds[k] = scriptCmd(ctx, pipe, "eval", script.src, keys[k], argv[k])
			again[j] = cmds[k]
		}
		wait := s.wait(ctx, pipe)
		s.calls.Add(1)
		_, _ = pipe.Exec(ctx)
		s.waited(wait, again)
	}
	return cmds
}

// scriptCmd queues on pipe the call of a script (name is "eval" with the
// script's text as body, or "evalsha" with its hash) with keys and argv.
// The keys go as pointers into keys, which box without allocating: a call
// costs the same few allocations whatever its number of keys.
func scriptCmd(ctx context.Context, pipe redis.Pipeliner, name, body string, keys []string, argv []any) *redis.Cmd {
	args := make([]any, 3, 3+len(keys)+len(argv))
	args[0], args[1], args[2] = name, body, len(keys)
	for i := range keys {
		args = append(args, &keys[i])
	}
	args = append(args, argv...)
	cmd := redis.NewCmd(ctx, args...)
	if len(keys) > 0 {
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
