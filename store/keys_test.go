package store

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
