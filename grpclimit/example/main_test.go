package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRun runs the example's main logic: three admitted calls with their
// headers, then a denial with its status, details and trailers.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, 3, 10*time.Second))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	t.Log("\n" + out.String())
	require.Len(t, lines, 11)
	assert.Regexp(t, `^server on 127\.0\.0\.1:\d+, 3 calls per 10s per peer$`, lines[0])
	for i, r := range []string{"2", "1", "0"} {
		assert.Equal(t, "call "+string(rune('1'+i))+": OK", lines[1+2*i])
		assert.Regexp(t, `^  headers:  ratelimit-policy: "10s";q=3;w=10  ratelimit: "10s";r=`+r+`;t=\d+  ratelimit-limit: 3  ratelimit-remaining: `+r+`  ratelimit-reset: \d+$`, lines[2+2*i])
	}
	m := regexp.MustCompile(`^call 4: ResourceExhausted: grpclimit: rate limit exceeded: 3 per 10s \(policy "10s"\); retry after (\S+)$`).FindStringSubmatch(lines[7])
	require.NotNil(t, m, lines[7])
	delay, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	assert.Positive(t, delay)
	assert.LessOrEqual(t, delay, 20*time.Second)
	assert.Equal(t, "  RetryInfo: retry_delay "+m[1], lines[8])
	assert.Equal(t, `  QuotaFailure: 10s: 3 per 10s (sliding window)`, lines[9])
	assert.Regexp(t, `^  trailers: ratelimit-policy: "10s";q=3;w=10  ratelimit: "10s";r=0;t=\d+  ratelimit-limit: 3  ratelimit-remaining: 0  ratelimit-reset: \d+  retry-after: \d+$`, lines[10])
}

// TestRunErrors checks that an invalid rule is an error, not a panic.
func TestRunErrors(t *testing.T) {
	assert.Error(t, run(&bytes.Buffer{}, 0, time.Second))
	assert.Error(t, run(&bytes.Buffer{}, 3, time.Microsecond))
}
