package store

import (
	"encoding/base64"
	"strconv"
	"sync"
	"unsafe"
)

// Key layout. Every key a store writes begins with the limiter's prefix:
//
//	<prefix>:{<base64url(user key)>}:<window ms>:<window id>          a window's count
//	<prefix>:{<base64url(user key)>}:<bucket ms>x<buckets>:<id>       a bucket's count
//	<prefix>:{<base64url(user key)>}:gcra:<interval µs>:<burst>       a bucket's arrival time
//	<prefix>:{<base64url(user key)>}:log                              a key's log (newest first)
//	<prefix>:m:{<tag>}:<node>                                         a node's push marker
//	<prefix>:t:{<tag>}:<node>.<stream>                                a node's take marker
//
// The user key is base64url-encoded, so it never contains '{' or '}': every
// counter of one user key shares the Redis Cluster hash slot of its braces,
// and no two user keys, whatever bytes they hold, share a counter. A
// marker's tag is a short string chosen to hash to its group's slot.

// keyBase returns "<prefix>:{<base64url(key)>}:", the part shared by every
// counter of key.
func keyBase(prefix, key string) []byte {
	return appendKeyBase(make([]byte, 0, len(prefix)+4+base64.RawURLEncoding.EncodedLen(len(key))+24), prefix, key)
}

// appendKeyBase appends "<prefix>:{<base64url(key)>}:" to b.
func appendKeyBase(b []byte, prefix, key string) []byte {
	b = append(b, prefix...)
	b = append(b, ":{"...)
	b = base64.RawURLEncoding.AppendEncode(b, []byte(key))
	return append(b, "}:"...)
}

// CounterKey returns the store key of counter c under prefix.
func CounterKey(prefix string, c Counter) string {
	return string(appendCounter(keyBase(prefix, c.Key), c))
}

// appendCounter appends the counter's part of its key to b.
func appendCounter(b []byte, c Counter) []byte {
	if c.Rate > 0 {
		b = append(b, "gcra:"...)
		b = strconv.AppendInt(b, c.Rate, 10)
		b = append(b, ':')
		return strconv.AppendInt(b, c.Burst, 10)
	}
	b = strconv.AppendInt(b, c.Window, 10)
	if c.Span > 1 {
		b = append(b, 'x')
		b = strconv.AppendInt(b, c.Span, 10)
	}
	b = append(b, ':')
	return strconv.AppendInt(b, c.ID, 10)
}

// counterLen returns the length of what appendCounter appends for c.
func counterLen(c Counter) int {
	if c.Rate > 0 {
		return 6 + intLen(c.Rate) + intLen(c.Burst)
	}
	n := intLen(c.Window) + 1 + intLen(c.ID)
	if c.Span > 1 {
		n += 1 + intLen(c.Span)
	}
	return n
}

// intLen returns the length of strconv.FormatInt(x, 10).
func intLen(x int64) int {
	n := 1
	u := uint64(x)
	if x < 0 {
		n, u = 2, -u
	}
	for ; u >= 10; u /= 10 {
		n++
	}
	return n
}

// LogKey returns the store key of key's log under prefix.
func LogKey(prefix, key string) string {
	return string(append(keyBase(prefix, key), "log"...))
}

// markerKey returns the key of node's marker of the given kind ('m' for
// pushes, 't' for takes) for the group whose slot is slot.
func markerKey(prefix string, kind byte, slot int, node string) string {
	b := make([]byte, 0, len(prefix)+len(node)+16)
	b = append(b, prefix...)
	b = append(b, ':', kind, ':', '{')
	b = append(b, slotTag(slot)...)
	b = append(b, '}', ':')
	b = append(b, node...)
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is never written again
}

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot returns the Redis Cluster hash slot of every counter of key.
func Slot(key string) int {
	// The CRC of base64url(key), fed the encoding's characters as they
	// are made: no buffer, whatever the key's length.
	var crc uint16
	i := 0
	for ; i+3 <= len(key); i += 3 {
		v := uint(key[i])<<16 | uint(key[i+1])<<8 | uint(key[i+2])
		crc = crcStep(crc, b64url[v>>18&63])
		crc = crcStep(crc, b64url[v>>12&63])
		crc = crcStep(crc, b64url[v>>6&63])
		crc = crcStep(crc, b64url[v&63])
	}
	switch len(key) - i { // the last bytes, unpadded
	case 2:
		v := uint(key[i])<<16 | uint(key[i+1])<<8
		crc = crcStep(crc, b64url[v>>18&63])
		crc = crcStep(crc, b64url[v>>12&63])
		crc = crcStep(crc, b64url[v>>6&63])
	case 1:
		v := uint(key[i]) << 16
		crc = crcStep(crc, b64url[v>>18&63])
		crc = crcStep(crc, b64url[v>>12&63])
	}
	return int(crc % Slots)
}

// b64url is the alphabet of base64.RawURLEncoding.
const b64url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// crc16 is CRC-16/XMODEM (polynomial 0x1021), the checksum Redis Cluster
// hashes keys with.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc = crcStep(crc, c)
	}
	return crc
}

// crcStep feeds the byte c to the CRC crc.
func crcStep(crc uint16, c byte) uint16 { return crc<<8 ^ crcTable[byte(crc>>8)^c] }

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

var (
	tagsOnce sync.Once
	tags     []string // a hash tag per slot
)

// slotTag returns a short string whose Redis Cluster hash slot is slot.
func slotTag(slot int) string {
	tagsOnce.Do(func() {
		tags = make([]string, Slots)
		left := Slots
		var buf [16]byte
		for i := uint64(0); left > 0; i++ {
			b := strconv.AppendUint(buf[:0], i, 36)
			s := crc16(b) % Slots
			if tags[s] == "" {
				tags[s] = string(b)
				left--
			}
		}
	})
	return tags[slot]
}
