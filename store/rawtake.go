package store

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
)

// takeBatchScript decides a batch of TakeRequests in one script call, in
// order, each atomically (see TakeRequest). A batch of several requests is
// only legal where every key lives on one server (the fast path's
// standalone Redis); through go-redis, each call carries one request.
// KEYS: every request's keys, one request after the other.
// ARGV: the number of requests, then per request: rules, cost, flags,
// now_us, then per rule: limit, window_ms, fixed, expire_at_ms.
// Reply: per request: allowed, then cur and prev per rule.
const takeBatchScript = `
local out = {}
local a, k = 2, 0
for _ = 1, tonumber(ARGV[1]) do
  local n, cost, flags, now = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  local peek = flags % 2 == 1
  local penalty = math.floor(flags / 2) % 2 == 1
  local cur, prev = {}, {}
  local ok = 1
  for i = 1, n do
    local b = a + (i - 1) * 4
    local limit, w, fixed = tonumber(ARGV[b]), tonumber(ARGV[b + 1]) * 1000, ARGV[b + 2] == '1'
    local c = tonumber(redis.call('GET', KEYS[k + 2 * i - 1]) or '0')
    local p = 0
    if not fixed then p = tonumber(redis.call('GET', KEYS[k + 2 * i]) or '0') end
    cur[i], prev[i] = c, p
    local est = c
    if p > 0 then est = est + p * (w - now % w) / w end
    if est + cost > limit + 1e-9 then ok = 0 end
  end
  if not peek and (ok == 1 or penalty) then
    for i = 1, n do
      local v = redis.call('INCRBY', KEYS[k + 2 * i - 1], cost)
      if v == cost then redis.call('PEXPIREAT', KEYS[k + 2 * i - 1], ARGV[a + (i - 1) * 4 + 3]) end
      cur[i] = v
    end
  end
  out[#out + 1] = ok
  for i = 1, n do
    out[#out + 1] = cur[i]
    out[#out + 1] = prev[i]
  end
  a = a + 4 * n
  k = k + 2 * n
end
return out
`

// errNoScript means the server does not have the script cached.
var errNoScript = errors.New("store: NOSCRIPT")

var takeBatchSHA = func() string {
	h := sha1.Sum([]byte(takeBatchScript))
	return hex.EncodeToString(h[:])
}()

// take decides reqs (already checked) with one script call on the pipe's
// own connection: one round trip and one script run for the whole batch.
func (p *rawPipe) take(ctx context.Context, reqs []*TakeRequest) error {
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	err = c.take(ctx, reqs, true)
	if errors.Is(err, errNoScript) {
		err = c.take(ctx, reqs, false) // not cached yet: send the script once
	}
	if err != nil {
		_ = c.c.Close()
		return err
	}
	p.put(c)
	return nil
}

func (c *rawConn) take(ctx context.Context, reqs []*TakeRequest, cached bool) error {
	dl, _ := ctx.Deadline()
	if err := c.c.SetDeadline(dl); err != nil {
		return err
	}
	nkeys, nargs := 0, 1
	for _, r := range reqs {
		nkeys += len(r.Keys)
		nargs += 4 + 4*len(r.Rules)
	}
	buf := appendArrayHeader(c.buf[:0], 3+nkeys+nargs)
	if cached {
		buf = appendBulk(buf, "EVALSHA")
		buf = appendBulk(buf, takeBatchSHA)
	} else {
		buf = appendBulk(buf, "EVAL")
		buf = appendBulk(buf, takeBatchScript)
	}
	buf = appendBulkInt(buf, int64(nkeys))
	for _, r := range reqs {
		for _, k := range r.Keys {
			buf = appendBulk(buf, k)
		}
	}
	buf = appendBulkInt(buf, int64(len(reqs)))
	for _, r := range reqs {
		flags := int64(0)
		if r.Peek {
			flags |= 1
		}
		if r.CountDenied {
			flags |= 2
		}
		buf = appendBulkInt(buf, int64(len(r.Rules)))
		buf = appendBulkInt(buf, r.Cost)
		buf = appendBulkInt(buf, flags)
		buf = appendBulkInt(buf, r.NowUs)
		for j, rule := range r.Rules {
			fixed := int64(0)
			if rule.Fixed {
				fixed = 1
			}
			buf = appendBulkInt(buf, rule.Limit)
			buf = appendBulkInt(buf, rule.WindowMs)
			buf = appendBulkInt(buf, fixed)
			buf = appendBulkInt(buf, r.ExpireAt[j])
		}
	}
	c.buf = buf[:0]
	if _, err := c.c.Write(buf); err != nil {
		return fmt.Errorf("store: redis take script: %w", err)
	}
	line, err := c.line()
	if err != nil {
		return fmt.Errorf("store: redis take script: %w", err)
	}
	if bytes.HasPrefix(line, []byte("-NOSCRIPT")) {
		return errNoScript
	}
	n, err := parseInt(line, '*')
	if err != nil {
		return fmt.Errorf("store: take script: %w", err)
	}
	want := 0
	for _, r := range reqs {
		want += 1 + len(r.Counts)
	}
	if n != int64(want) {
		return fmt.Errorf("store: take script replied %d values, want %d", n, want)
	}
	for _, r := range reqs {
		for i := -1; i < len(r.Counts); i++ {
			line, err := c.line()
			if err != nil {
				return fmt.Errorf("store: redis take script: %w", err)
			}
			v, err := parseInt(line, ':')
			if err != nil {
				return fmt.Errorf("store: take script reply: %w", err)
			}
			if i < 0 {
				r.Allowed = v == 1
			} else {
				r.Counts[i] = v
			}
		}
	}
	return nil
}
