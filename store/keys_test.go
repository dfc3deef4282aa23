package store

import (
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/local"
)

// Keys are arbitrary bytes: no two keys share a counter, and every counter
// of a key carries the whole encoded key as its Redis Cluster hash tag.
func TestKeyEncoding(t *testing.T) {
	keys := []string{"a", "a}", "{a}", "}{", "a:b", "a b", "a\nb", "\x00\xff\xfe", "a:{b}:1000:1", strings.Repeat("x", 4096), "ключ", "a=="}
	seen := map[string]string{}
	for _, k := range keys {
		ck := CounterKey("hl", Counter{Key: k, Window: 1000, ID: 5})
		if other, dup := seen[ck]; dup {
			t.Fatalf("keys %q and %q share counter %q", k, other, ck)
		}
		seen[ck] = k
		checkCounterKey(t, "hl", k, ck)
	}
}

func checkCounterKey(t *testing.T, prefix, key, ck string) {
	t.Helper()
	require.True(t, strings.HasPrefix(ck, prefix+":{"), "%q", ck)
	rest := ck[len(prefix)+2:]
	end := strings.IndexByte(rest, '}')
	require.GreaterOrEqual(t, end, 0, "%q", ck)
	tag := rest[:end]
	dec, err := base64.RawURLEncoding.DecodeString(tag)
	require.NoError(t, err)
	assert.Equal(t, key, string(dec), "the tag decodes to the key")
	assert.Equal(t, Slot(key), int(crc16([]byte(tag))%Slots), "Slot is the tag's slot")
	assert.Equal(t, "}:1000:5", rest[end:])
}

func FuzzCounterKey(f *testing.F) {
	for _, k := range []string{"a", "{x}", "}{", "a\x00b", strings.Repeat("é", 100)} {
		f.Add(k, k+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == "" || b == "" {
			return
		}
		ka := CounterKey("p", Counter{Key: a, Window: 1000, ID: 5})
		kb := CounterKey("p", Counter{Key: b, Window: 1000, ID: 5})
		if (a == b) != (ka == kb) {
			t.Fatalf("keys %q and %q: counters %q and %q", a, b, ka, kb)
		}
		checkCounterKey(t, "p", a, ka)
	})
}

// redisSlot is Redis Cluster's hash slot of a whole key, as the server
// computes it: the part between the first '{' and the first '}' after it
// when that part is not empty, the whole key otherwise.
func redisSlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16([]byte(key)) % Slots)
}

// Whatever bytes a user key holds ('{', '}', ':', NUL, invalid UTF-8),
// and whatever a counter's numbers, every key the store writes for it is
// in the slot Slot reports (the server's hash tag is the encoded user key,
// never a part of it nor of the prefix), no two user keys share a key,
// and a log's key is never a counter's.
func FuzzKeySlots(f *testing.F) {
	for _, k := range []string{"a", "{", "}", "{}", "}{", "a{b}c", "{a}:{b}", "\x00{\xff}", strings.Repeat("{x}", 40)} {
		f.Add(k, k+"}", "hl", int64(1000), int64(5), int64(1), int64(0))
	}
	f.Add("a", "b", "p-1", int64(31_622_400_000), int64(-1), int64(64), int64(1000))
	f.Fuzz(func(t *testing.T, a, b, prefix string, w, id, span, rate int64) {
		if a == "" || b == "" || prefix == "" || len(prefix) > 64 || strings.ContainsAny(prefix, "{}:") {
			return // keys are not empty; Config refuses such prefixes
		}
		c := Counter{Key: a, Window: w, ID: id, Span: span}
		if rate > 0 {
			c = Counter{Key: a, Rate: rate, Burst: span}
		}
		cb := c
		cb.Key = b
		ka, kb := CounterKey(prefix, c), CounterKey(prefix, cb)
		la, lb := LogKey(prefix, a), LogKey(prefix, b)
		slot := Slot(a)
		for _, k := range []string{ka, la} {
			if got := redisSlot(k); got != slot {
				t.Fatalf("key %q of %q: Redis hashes it to slot %d, Slot says %d", k, a, got, slot)
			}
		}
		if (a == b) != (ka == kb) || (a == b) != (la == lb) {
			t.Fatalf("keys %q and %q: counters %q and %q, logs %q and %q", a, b, ka, kb, la, lb)
		}
		if la == kb || lb == ka {
			t.Fatalf("a log and a counter share a key: %q %q %q %q", la, lb, ka, kb)
		}
		mk := markerKey(prefix, 'm', slot, "node")
		if redisSlot(mk) != slot || mk == ka || mk == la {
			t.Fatalf("marker %q of slot %d: slot %d, counter %q, log %q", mk, slot, redisSlot(mk), ka, la)
		}
	})
}

// The slots agree with Redis Cluster's: CRC-16/XMODEM's check value, and
// the slots Redis documents.
func TestSlots(t *testing.T) {
	assert.Equal(t, uint16(0x31c3), crc16([]byte("123456789")))
	assert.Equal(t, 12182, int(crc16([]byte("foo"))%Slots), "CLUSTER KEYSLOT foo")
	for slot := range Slots {
		tag := slotTag(slot)
		require.Equal(t, slot, int(crc16([]byte(tag))%Slots), "tag %q", tag)
		require.LessOrEqual(t, len(tag), 4)
	}
	mk := markerKey("hl", 'm', 42, "node")
	assert.Equal(t, "hl:m:{"+slotTag(42)+"}:node", mk, "markers live under the prefix")
}

// The take script's keys are the counters' and logs' own keys (the async
// mode pushes to the same ones), in the order the script reads them, for
// every algorithm and for keys of any length, and its arguments are
// numbers.
func TestTakeArgsKeys(t *testing.T) {
	rules := []local.Rule{
		local.NewRule(local.Spec{Kind: local.Sliding, Limit: 3, Window: time.Minute}),
		local.NewRule(local.Spec{Kind: local.Fixed, Limit: 3, Window: time.Second}),
		local.NewRule(local.Spec{Kind: local.Buckets, Limit: 3, Window: time.Minute, Buckets: 3}),
		local.NewRule(local.Spec{Kind: local.Log, Limit: 3, Window: time.Minute}),
		local.NewRule(local.Spec{Kind: local.GCRA, Limit: 1, Window: time.Second, Burst: 3}),
		local.NewRule(local.Spec{Kind: local.Leaky, Limit: 1, Window: time.Second, Burst: 2}),
	}
	var reqs []*TakeRequest
	for i, k := range []string{"a", "{b}", strings.Repeat("long", 300), "ключ"} {
		reqs = append(reqs, &TakeRequest{Prefix: "hl", Key: k, Rules: rules, Now: 1_700_000_000_123_456 + int64(i)*1_000_000, Cost: 1})
	}
	keys, argv := takeArgs("marker", 7, 60_000, reqs)
	want := []string{"marker"}
	for _, q := range reqs {
		for i := range rules {
			r := &rules[i]
			w, span := r.Counter()
			id := q.Now / w.Microseconds()
			switch r.Kind() {
			case local.Sliding:
				want = append(want, CounterKey("hl", CounterOf(r, q.Key, id)), CounterKey("hl", CounterOf(r, q.Key, id-1)),
					CounterKey("hl", CounterOf(r, q.Key, id+1)))
			case local.Fixed:
				want = append(want, CounterKey("hl", CounterOf(r, q.Key, id)))
			case local.Buckets:
				for j := range span {
					want = append(want, CounterKey("hl", CounterOf(r, q.Key, id-span+1+j)))
				}
				want = append(want, CounterKey("hl", CounterOf(r, q.Key, id+1)))
			case local.Log:
				want = append(want, LogKey("hl", q.Key))
			default:
				want = append(want, CounterKey("hl", CounterOf(r, q.Key, 0)))
			}
		}
	}
	assert.Equal(t, want, keys)
	require.Len(t, argv, 5+5*len(rules)+3*len(reqs))
	for i, a := range argv {
		_, ok := a.(*int64)
		assert.True(t, ok, "argument %d is a %T", i, a)
	}
	assert.Equal(t, reqs[3].Now, *argv[len(argv)-1].(*int64))
}

func TestPushKeysAreCounterKeys(t *testing.T) {
	b := &Batch{Prefix: "p", Ops: []Op{
		{Counter: Counter{Key: "a", Window: 60_000, ID: 3}},
		{Counter: Counter{Key: "", Window: 1000, ID: -1, Span: 4}},
		{Counter: Counter{Key: "\x00{}\xff" + strings.Repeat("k", 300), Rate: 5000, Burst: 7}},
	}}
	keys := pushKeys("marker", b, nil)
	require.Len(t, keys, 1+len(b.Ops))
	require.Equal(t, "marker", keys[0])
	for j, op := range b.Ops {
		require.Equal(t, CounterKey(b.Prefix, op.Counter), keys[1+j], "op %d", j)
	}
	require.Equal(t, []string{"m"}, pushKeys("m", &Batch{}, nil))
	keys = pushKeys("marker", b, []int{2, 0, 1})
	require.Equal(t, []string{"marker", CounterKey("p", b.Ops[2].Counter), CounterKey("p", b.Ops[0].Counter), CounterKey("p", b.Ops[1].Counter)}, keys)
}

// TestPushOrder: the push script gets the ops on a count first, in the
// batch's order, then the arrival times, each with its rate last, after
// the batch's header (ops, seq, counts, the largest delta of a count, the
// seq before it) and, but for a call's first batch, its keys.
func TestPushOrder(t *testing.T) {
	count := func(d int64) Op { return Op{Counter: Counter{Key: "c", Window: 1000}, Delta: d} }
	rate := func(d, r int64) Op { return Op{Counter: Counter{Key: "r", Rate: r, Burst: 1}, Delta: d} }
	for _, tc := range []struct {
		ops    []Op
		order  []int
		counts int
		argv   []any
	}{
		{nil, nil, 0, []any{0, uint64(9), 0, int64(0), uint64(7)}},
		{[]Op{count(1), count(-4), count(2)}, nil, 3, []any{3, uint64(9), 3, int64(2), uint64(7), int64(1), int64(-4), int64(2)}},
		{[]Op{rate(3, 70), count(1), rate(4, 80), count(2)}, []int{1, 3, 0, 2}, 2,
			[]any{4, uint64(9), 2, int64(2), uint64(7), int64(1), int64(2), int64(3), int64(4), int64(70), int64(80)}},
		{[]Op{rate(3, 70)}, []int{0}, 0, []any{1, uint64(9), 0, int64(0), uint64(7), int64(3), int64(70)}},
	} {
		b := &Batch{Seq: 9, Ops: tc.ops}
		order, counts := pushOrder(b)
		require.Equal(t, tc.order, order)
		require.Equal(t, tc.counts, counts)
		require.Equal(t, append([]any{int64(5)}, tc.argv...), appendPushArgs([]any{int64(5)}, b, order, counts, 7, nil))
		// A later batch of a call carries its keys after its header.
		keys := []string{"m", "k"}
		got := appendPushArgs(nil, b, order, counts, 7, keys)
		require.Len(t, got, len(tc.argv)+len(keys))
		require.Equal(t, tc.argv[:5], got[:5])
		require.Equal(t, []any{&keys[0], &keys[1]}, got[5:7])
		require.Equal(t, tc.argv[5:], got[7:])
	}
}

// TestPushCallArgs: a call's keys are the first batch's, its ARGV the TTL,
// then each batch's arguments, keys for all but the first, all after the
// three free slots in a slice of its exact length.
func TestPushCallArgs(t *testing.T) {
	count := func(d int64) Op { return Op{Counter: Counter{Key: "c", Window: 1000}, Delta: d} }
	rate := func(d, r int64) Op { return Op{Counter: Counter{Key: "r", Rate: r, Burst: 1}, Delta: d} }
	batches := []*Batch{
		{Prefix: "p", Node: "n", Group: 3, Seq: 9, Ops: []Op{count(1), rate(2, 70)}},
		{Prefix: "p", Node: "n", Group: 5, Seq: 4, Ops: []Op{rate(3, 80), count(4), count(5)}},
		{Prefix: "p", Node: "n", Group: 6, Seq: 2},
	}
	items := []int{0, 1, 2}
	orders, counts := make([][]int, 3), make([]int, 3)
	for _, i := range items {
		orders[i], counts[i] = pushOrder(batches[i])
	}
	args, nkeys := (&Redis{}).pushCall(batches, items, orders, counts, []uint64{0, 0, 1}, 60_000)
	require.Equal(t, len(args), cap(args))
	require.Equal(t, []any{nil, nil, nil}, args[:3])
	keys := pushKeys(markerKey("p", 'm', 3, "n"), batches[0], orders[0])
	require.Equal(t, len(keys), nkeys)
	for j, k := range keys {
		require.Equal(t, k, *args[3+j].(*string), "key %d", j)
	}
	argv := args[3+nkeys:]
	want := append([]any{int64(60_000)}, appendPushArgs(nil, batches[0], orders[0], counts[0], 0, nil)...)
	k1 := pushKeys(markerKey("p", 'm', 5, "n"), batches[1], orders[1])
	want = appendPushArgs(want, batches[1], orders[1], counts[1], 0, k1)
	k2 := pushKeys(markerKey("p", 'm', 6, "n"), batches[2], orders[2])
	want = appendPushArgs(want, batches[2], orders[2], counts[2], 1, k2)
	require.Len(t, argv, len(want))
	for j := range want {
		if p, ok := want[j].(*string); ok {
			require.Equal(t, *p, *argv[j].(*string), "argument %d", j)
		} else {
			require.Equal(t, want[j], argv[j], "argument %d", j)
		}
	}
}

// TestPushCallsOf: small batches share a call up to maxCallOps ops; a
// batch with more goes alone.
func TestPushCallsOf(t *testing.T) {
	of := func(ns ...int) []*Batch {
		bs := make([]*Batch, len(ns))
		for i, n := range ns {
			bs[i] = &Batch{Ops: make([]Op, n)}
		}
		return bs
	}
	for _, tc := range []struct {
		ops  []int
		send []int
		want [][]int
	}{
		{[]int{1}, []int{0}, [][]int{{0}}},
		{[]int{1, 2, 3}, []int{0, 1, 2}, [][]int{{0, 1, 2}}},
		{[]int{1, 2, 3}, []int{2, 0}, [][]int{{2, 0}}},
		{[]int{maxCallOps, 1, maxCallOps - 1, 1}, []int{0, 1, 2, 3}, [][]int{{0}, {1, 2}, {3}}},
		{[]int{maxCallOps + 5, 1}, []int{1, 0}, [][]int{{1}, {0}}},
		{[]int{200, 200, 200}, []int{0, 1, 2}, [][]int{{0, 1}, {2}}},
	} {
		require.Equal(t, tc.want, pushCallsOf(of(tc.ops...), tc.send), "%v", tc.ops)
	}
}

func TestCounterLen(t *testing.T) {
	for _, x := range []int64{0, 1, 9, 10, 99, 100, -1, -9, -10, math.MaxInt64, math.MinInt64, math.MinInt64 + 1, 1e18} {
		for _, c := range []Counter{
			{Window: x, ID: x}, {Window: 60_000, ID: x, Span: x}, {Window: x, ID: 7, Span: 2},
			{Rate: 1, Burst: x}, {Rate: max(x, 1), Burst: x},
		} {
			require.Equal(t, len(appendCounter(nil, c)), counterLen(c), "%+v", c)
		}
	}
}

// Slot is the slot of the encoded key at every length (each remainder of
// the encoding's 3-byte groups) and for every byte value.
func TestSlotIsTheEncodedKeysSlot(t *testing.T) {
	b := make([]byte, 0, 300)
	for n := range 300 {
		for _, k := range []string{string(b), strings.Repeat("\xff", n), strings.Repeat("?", n)} {
			want := int(crc16([]byte(base64.RawURLEncoding.EncodeToString([]byte(k)))) % Slots)
			require.Equal(t, want, Slot(k), "key %q", k)
		}
		b = append(b, byte(n*37+n/3))
	}
}

func BenchmarkSlot(b *testing.B) {
	for _, n := range []int{8, 24, 100} {
		key := strings.Repeat("k", n)
		b.Run("fused/"+strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				Slot(key)
			}
		})
		b.Run("encoded/"+strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				var buf [96]byte
				_ = int(crc16(base64.RawURLEncoding.AppendEncode(buf[:0], []byte(key))) % Slots)
			}
		})
	}
}
