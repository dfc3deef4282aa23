package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

func TestConfigValidation(t *testing.T) {
	ok := []Rule{{Limit: 10, Window: time.Second}}
	mem := store.NewMemory(nil)
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; it names the field and the range
	}{
		{"no rules", Config{}, "Config.Rules has 0 rules, want 1 to 16"},
		{"too many rules", Config{Rules: make([]Rule, 17)}, "Config.Rules has 17 rules, want 1 to 16"},
		{"zero limit", Config{Rules: []Rule{{Limit: 0, Window: time.Second}}}, "Config.Rules[0].Limit is 0, want 1 to"},
		{"negative limit", Config{Rules: []Rule{ok[0], {Limit: -1, Window: time.Minute}}}, "Config.Rules[1].Limit is -1"},
		{"huge limit", Config{Rules: []Rule{{Limit: 1 << 41, Window: time.Second}}}, "Config.Rules[0].Limit is 2199023255552, want 1 to 1099511627776"},
		{"zero window", Config{Rules: []Rule{{Limit: 1}}}, "Config.Rules[0].Window is 0s, want 1ms to 8784h0m0s"},
		{"sub-ms window", Config{Rules: []Rule{{Limit: 1, Window: 1500 * time.Microsecond}}}, "Config.Rules[0].Window is 1.5ms, want a whole number of milliseconds"},
		{"window too long", Config{Rules: []Rule{{Limit: 1, Window: 400 * 24 * time.Hour}}}, "Config.Rules[0].Window is 9600h0m0s, want 1ms to"},
		{"bad type", Config{Rules: []Rule{{Limit: 1, Window: time.Second, Type: 7}}}, "Config.Rules[0].Type is Algorithm(7), want Sliding, Fixed, Bucketed, Log, TokenBucket or LeakyBucket"},
		{"duplicate window", Config{Rules: []Rule{ok[0], {Limit: 5, Window: time.Second, Type: Fixed}}}, "Config.Rules[1] (5/1s fixed) counts like Config.Rules[0] (10/1s sliding)"},
		{"duplicate bucket", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Type: TokenBucket}, {Limit: 10, Window: 2 * time.Second, Type: LeakyBucket, Burst: 5}}}, "Config.Rules[1] (10/2s leaky-bucket burst 5) counts like Config.Rules[0]"},
		{"buckets missing", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Type: Bucketed}}}, "Config.Rules[0].Buckets is 0, want 2 to 64 for a Bucketed rule"},
		{"buckets uneven", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Type: Bucketed, Buckets: 7}}}, "Config.Rules[0].Buckets is 7, which does not divide Window 1s into whole milliseconds"},
		{"buckets on sliding", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Buckets: 10}}}, "Config.Rules[0].Buckets is 10, but only a Bucketed rule has buckets"},
		{"window shorter than a sync", Config{Rules: []Rule{{Limit: 5, Window: 50 * time.Millisecond}}, Mode: ModeAsync, Store: mem}, "Config.Rules[0] has a window of 50ms, shorter than Config.SyncRate 100ms: in ModeAsync a window lasts at least a sync period"},
		{"fixed window shorter than a sync", Config{Rules: []Rule{ok[0], {Limit: 5, Window: 500 * time.Millisecond, Type: Fixed}}, Mode: ModeAsync, Store: mem, SyncRate: time.Second}, "Config.Rules[1] has a window of 500ms, shorter than Config.SyncRate 1s"},
		{"log shorter than two syncs", Config{Rules: []Rule{{Limit: 5, Window: 150 * time.Millisecond, Type: Log}}, Mode: ModeAsync, Store: mem, SyncRate: 100 * time.Millisecond}, "Config.Rules[0] is a Log rule of 150ms: in ModeAsync it counts in at least 2 buckets of at least Config.SyncRate 100ms each, so its Window must be at least 200ms"},
		// In ModeAsync a Log rule of 1s counts in 10 buckets of 100ms at a
		// 50ms sync, the store keys of a Bucketed rule of 1s in 10: both
		// pushed to them, and 8 admitted requests read as 16.
		{"log counts like bucketed", Config{Rules: []Rule{{Limit: 10, Window: time.Second, Type: Log}, {Limit: 15, Window: time.Second, Type: Bucketed, Buckets: 10}}, Mode: ModeAsync, Store: mem, SyncRate: 50 * time.Millisecond}, "Config.Rules[0] is a Log rule of 1s: in ModeAsync it counts in 10 buckets, as Config.Rules[1] (15/1s bucketed×10) does"},
		{"buckets shorter than sync", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Type: Bucketed, Buckets: 20}}, Mode: ModeAsync, Store: mem, SyncRate: 100 * time.Millisecond}, "Config.Rules[0] has buckets of 50ms, shorter than Config.SyncRate 100ms"},
		{"log limit", Config{Rules: []Rule{{Limit: 1 << 17, Window: time.Second, Type: Log}}}, "Config.Rules[0].Limit is 131072, want 1 to 65536 for a log rule"},
		{"burst on sliding", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Burst: 3}}}, "Config.Rules[0].Burst is 3, but only TokenBucket and LeakyBucket rules have a burst"},
		{"negative burst", Config{Rules: []Rule{{Limit: 5, Window: time.Second, Type: TokenBucket, Burst: -1}}}, "Config.Rules[0].Burst is -1, want 1 to 1099511627776 (0: Limit)"},
		{"bucket too fast", Config{Rules: []Rule{{Limit: 10_000, Window: time.Millisecond, Type: TokenBucket}}}, "Config.Rules[0] is 10000 per 1ms, faster than one per microsecond"},
		// A bucket that refills in longer than MaxWindow: its arrival time,
		// in ns, would pass the largest int64 (2.4M hours: every request of
		// cost 2.4M was admitted, one after the other).
		{"bucket refill too long", Config{Rules: []Rule{{Limit: 1, Window: time.Hour, Type: TokenBucket, Burst: 2_400_000}}}, "Config.Rules[0].Burst is 2400000: at 1 per 1h0m0s the bucket refills in longer than MaxWindow 8784h0m0s"},
		{"leaky queue too long", Config{Rules: []Rule{{Limit: 3, Window: 366 * 24 * time.Hour, Type: LeakyBucket, Burst: 4}}}, "Config.Rules[0].Burst is 4: at 3 per 8784h0m0s the bucket refills in longer than MaxWindow"},
		{"bad mode", Config{Rules: ok, Mode: 9}, "Config.Mode is Mode(9), want ModeLocal, ModeAsync or ModeSynchronous"},
		{"store in local mode", Config{Rules: ok, Store: mem}, "Config.Store is set but Config.Mode is local"},
		{"async without store", Config{Rules: ok, Mode: ModeAsync}, "Config.Store is nil, want a store in Config.Mode async"},
		{"synchronous without store", Config{Rules: ok, Mode: ModeSynchronous}, "Config.Store is nil, want a store in Config.Mode synchronous"},
		{"sync rate too small", Config{Rules: ok, Mode: ModeAsync, Store: mem, SyncRate: time.Microsecond}, "Config.SyncRate is 1µs, want 1ms to 1h"},
		{"sync rate too large", Config{Rules: ok, Mode: ModeAsync, Store: mem, SyncRate: 2 * time.Hour}, "Config.SyncRate is 2h0m0s, want 1ms to 1h"},
		{"sync rate in local mode", Config{Rules: ok, SyncRate: time.Second}, "Config.SyncRate is 1s, but only ModeAsync syncs periodically"},
		{"bad failure policy", Config{Rules: ok, FailurePolicy: 3}, "Config.FailurePolicy is FailurePolicy(3), want FailOpen or FailClosed"},
		{"negative max keys", Config{Rules: ok, MaxKeys: -1}, "Config.MaxKeys is -1, want 1 to 2147483648"},
		{"negative max key len", Config{Rules: ok, MaxKeyLen: -5}, "Config.MaxKeyLen is -5, want 1 to 65536"},
		{"max key len too large", Config{Rules: ok, MaxKeyLen: 1 << 20}, "Config.MaxKeyLen is 1048576, want 1 to 65536"},
		{"prefix with brace", Config{Rules: ok, Prefix: "a{b"}, `Config.Prefix is "a{b", want at most 64 bytes without '{', '}' or ':'`},
		{"prefix with colon", Config{Rules: ok, Prefix: "a:b"}, "Config.Prefix is"},
		{"store timeout", Config{Rules: ok, StoreTimeout: 2 * time.Minute}, "Config.StoreTimeout is 2m0s, want 1ms to 1m"},
		{"clock resolution", Config{Rules: ok, ClockResolution: 2 * time.Second}, "Config.ClockResolution is 2s, want 1µs to 1s"},
		{"clock sync", Config{Rules: ok, ClockSync: time.Millisecond}, "Config.ClockSync is 1ms, want 1s to 1h"},
		{"log every", Config{Rules: ok, LogEvery: -time.Second}, "Config.LogEvery is -1s, want 1ms to 1h"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		if assert.Error(t, err, tt.name) {
			assert.Contains(t, err.Error(), tt.want, tt.name)
			assert.Contains(t, err.Error(), "hybridlimit: ", tt.name)
		}
	}
	// Buckets that refill within MaxWindow, to the microsecond intervals'
	// rounding, are valid.
	for _, r := range []Rule{
		{Limit: 7, Window: MaxWindow, Type: TokenBucket},
		{Limit: 1, Window: time.Hour, Type: LeakyBucket, Burst: 8784},
		{Limit: 3_600_000_000, Window: time.Hour, Type: TokenBucket, Burst: MaxLimit}, // 1/µs
	} {
		l, err := New(Config{Rules: []Rule{r}})
		if assert.NoError(t, err, "%v", r) {
			_ = l.Close(context.Background())
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := Config{Rules: []Rule{{Limit: 1, Window: time.Second}}, Mode: ModeAsync, Store: store.NewMemory(nil)}.validate()
	require.NoError(t, err)
	assert.Equal(t, DefaultSyncRate, cfg.SyncRate)
	assert.Equal(t, DefaultMaxKeys, cfg.MaxKeys)
	assert.Equal(t, DefaultMaxKeyLen, cfg.MaxKeyLen)
	assert.Equal(t, DefaultPrefix, cfg.Prefix)
	assert.Equal(t, DefaultStoreTimeout, cfg.StoreTimeout)
	assert.Equal(t, time.Millisecond, cfg.ClockResolution, "real clock: coarse 1ms timestamp")
	assert.Equal(t, DefaultClockSync, cfg.ClockSync)
	assert.NotNil(t, cfg.Clock)

	// The zero Mode is local and needs nothing else.
	l, err := New(Config{Rules: []Rule{{Limit: 1, Window: time.Second}}})
	require.NoError(t, err)
	assert.Equal(t, ModeLocal, l.Mode())
	require.NoError(t, l.Close(t.Context()))
}

func TestInputErrors(t *testing.T) {
	l, _ := newMockLimiter(t, Config{Rules: []Rule{{Limit: 5, Window: time.Second}, {Limit: 3, Window: time.Minute}}, MaxKeyLen: 8})
	ctx := t.Context()
	_, err := l.Allow(ctx, "")
	assert.ErrorIs(t, err, ErrEmptyKey)
	assert.EqualError(t, err, "hybridlimit: empty key; want 1 to Config.MaxKeyLen (8) bytes")
	_, err = l.Allow(ctx, "123456789")
	assert.EqualError(t, err, "hybridlimit: key of 9 bytes exceeds Config.MaxKeyLen 8")
	assert.ErrorIs(t, err, ErrKeyTooLong)
	_, err = l.AllowN(ctx, "k", 0)
	assert.EqualError(t, err, "hybridlimit: AllowN(n=0): cost must be at least 1")
	_, err = l.AllowN(ctx, "k", -3)
	assert.EqualError(t, err, "hybridlimit: AllowN(n=-3): cost must be at least 1")
	_, err = l.AllowN(ctx, "k", 4)
	assert.EqualError(t, err, "hybridlimit: AllowN(n=4) exceeds Config.Rules[1].Limit 3: it can never be admitted")
	assert.ErrorIs(t, err, ErrCost)
	assert.Equal(t, FailOpen, l.FailurePolicy())
	_, err = l.PeekN(ctx, "k", 4)
	assert.EqualError(t, err, "hybridlimit: PeekN(n=4) exceeds Config.Rules[1].Limit 3: it can never be admitted")
	_, err = l.WaitN(ctx, "k", 0)
	assert.Error(t, err)
	_, err = l.State(ctx, "", nil)
	assert.ErrorIs(t, err, ErrEmptyKey)
	require.NoError(t, l.Close(ctx))
	_, err = l.Allow(ctx, "k")
	assert.ErrorIs(t, err, ErrClosed)
}
