package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// Escalating bans: BanPolicy blocks, through the policy store, the keys
// that one node keeps denying.

// BanPolicy blocks a key that keeps being denied, in the manner of
// fail2ban: when one node has denied a key Denials times within Within,
// the key is blocked on every node for For; a key blocked again within
// Forget of its last block's end is blocked twice as long as the last
// time, up to Max. Blocks are kept in the store, so they hold on every
// node (within one sync period) and survive restarts; in ModeLocal they
// live in memory. A blocked key's requests are denied before any rule
// counts them, with Result.Blocked set. The zero value bans nothing.
type BanPolicy struct {
	// Denials is how many denials within Within trigger a block: 1 to
	// 1,000,000, or 0 to ban nothing. A node counts a key's denials in
	// periods of Within, each starting at the first denial after the last
	// period ended.
	Denials int
	// Within is the period Denials are counted over: 1ms to 24h, default
	// 1 minute.
	Within time.Duration
	// For is the first block's length, Max the longest: 1s ≤ For ≤ Max ≤
	// 366 days, whole milliseconds; defaults 1 minute and the larger of 24
	// hours and For.
	For, Max time.Duration
	// Forget is how long after a block ends a new one still doubles it:
	// up to 366 days; 0 means the default, 24 hours. Blocks never double
	// with a Forget below 1ms, or with Max equal to For. Times are kept
	// to the millisecond: a block lasts at least its length, at most 1ms
	// more.
	Forget time.Duration
	// Reason is the blocks' reason, default "too many denied requests".
	Reason string
}

// validate checks b and fills in its defaults.
func (b *BanPolicy) validate() error {
	if b.Denials == 0 {
		if *b != (BanPolicy{}) {
			return errors.New("hybridlimit: Config.Ban has fields set but Denials is 0; set Denials to ban keys")
		}
		return nil
	}
	if b.Denials < 1 || b.Denials > 1_000_000 {
		return fmt.Errorf("hybridlimit: Config.Ban.Denials is %d, want 1 to 1000000 (0: no bans)", b.Denials)
	}
	if b.Within == 0 {
		b.Within = time.Minute
	}
	if b.For == 0 {
		b.For = time.Minute
	}
	if b.Max == 0 {
		b.Max = max(24*time.Hour, b.For)
	}
	if b.Forget == 0 {
		b.Forget = 24 * time.Hour
	}
	if b.Reason == "" {
		b.Reason = "too many denied requests"
	}
	switch {
	case b.Within < time.Millisecond || b.Within > 24*time.Hour:
		return fmt.Errorf("hybridlimit: Config.Ban.Within is %v, want 1ms to 24h", b.Within)
	case b.For < time.Second || b.Max < b.For || b.Max > MaxWindow:
		return fmt.Errorf("hybridlimit: Config.Ban.For is %v and Max %v, want 1s ≤ For ≤ Max ≤ %v", b.For, b.Max, MaxWindow)
	case b.For%time.Millisecond != 0:
		// The store keeps blocks in whole milliseconds: a length between
		// them would end a block before For has passed.
		return fmt.Errorf("hybridlimit: Config.Ban.For is %v, want a whole number of milliseconds", b.For)
	case b.Max%time.Millisecond != 0:
		return fmt.Errorf("hybridlimit: Config.Ban.Max is %v, want a whole number of milliseconds", b.Max)
	case b.Forget < 0 || b.Forget > MaxWindow:
		return fmt.Errorf("hybridlimit: Config.Ban.Forget is %v, want 1ns to %v (0: 24h)", b.Forget, MaxWindow)
	}
	return nil
}

// bans counts each key's denials on this node and blocks, through the
// policy store, the keys that reach BanPolicy.Denials.
type bans struct {
	p       BanPolicy
	counts  *xsync.MapOf[string, *banCount]
	pending *xsync.MapOf[string, struct{}] // keys being blocked

	mu     sync.Mutex // guards closed and wg.Add
	closed bool
	wg     sync.WaitGroup
}

func newBans(p BanPolicy) *bans {
	return &bans{p: p, counts: xsync.NewMapOf[string, *banCount](), pending: xsync.NewMapOf[string, struct{}]()}
}

// close waits for the blocks under way and refuses new ones.
func (b *bans) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// banCount is a key's denials since start (ns).
type banCount struct {
	mu    sync.Mutex
	start int64
	n     int
}

// maxBanKeys bounds the keys whose denials a node counts at once.
const maxBanKeys = 1 << 16

// denied counts a denial of key at now and reports whether it is the one
// that reaches the policy's threshold.
func (b *bans) denied(key string, now int64) bool {
	c, ok := b.counts.Load(key)
	if !ok {
		if b.counts.Size() >= maxBanKeys {
			b.sweep(now)
			if b.counts.Size() >= maxBanKeys {
				return false // too many offenders at once: count again once the oldest expire
			}
		}
		c, _ = b.counts.LoadOrCompute(key, func() *banCount { return &banCount{start: now} })
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now-c.start >= int64(b.p.Within) {
		c.start, c.n = now, 0
	}
	c.n++
	if c.n < b.p.Denials {
		return false
	}
	c.start, c.n = now, 0
	return true
}

// sweep forgets the counts older than Within.
func (b *bans) sweep(now int64) {
	b.counts.Range(func(k string, c *banCount) bool {
		c.mu.Lock()
		old := now-c.start >= int64(b.p.Within)
		c.mu.Unlock()
		if old {
			b.counts.Delete(k)
		}
		return true
	})
}

// noteDenied feeds a denial of key to the ban policy, and blocks the key
// through the policy store when it reaches the threshold: at once in
// ModeLocal, in the background otherwise.
func (l *Limiter) noteDenied(key string, now int64) {
	b := l.bans
	if b == nil || !b.denied(key, now) {
		return
	}
	if _, busy := b.pending.LoadOrStore(key, struct{}{}); busy {
		return
	}
	block := func() {
		defer b.pending.Delete(key)
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.StoreTimeout)
		defer cancel()
		// From now rounded up to the store's millisecond: the block
		// lasts at least For (see Limiter.until).
		_, err := l.pol.st.Escalate(ctx, l.cfg.Prefix, key, b.p.Reason, ceilMs(now), b.p.For, b.p.Max, b.p.Forget)
		if err == nil {
			err = l.pol.reload(ctx, true)
		}
		if err != nil && l.loop != nil {
			l.loop.ReportError(err)
		}
	}
	if l.cfg.Mode == ModeLocal {
		block()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.pending.Delete(key)
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		block()
	}()
}
