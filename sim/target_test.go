package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// targetScenario is small enough to search in a fraction of a second.
// targetScenario searches the naive policy, whose overshoot grows with
// the sync rate: the search's mechanics show plainly.
var targetScenario = []string{"-nodes", "4", "-duration", "5s", "-rules", "100/1s", "-keys", "3", "-seed", "1", "-policy", "naive"}

type targetJSON struct {
	TargetPct   float64  `json:"target_pct"`
	AnswerMs    *float64 `json:"answer_sync_rate_ms"`
	AnswerCalls *float64 `json:"answer_store_calls_per_s"`
	UseSyncMode bool     `json:"use_sync_mode"`
	Candidates  []struct {
		SyncRateMs   float64 `json:"sync_rate_ms"`
		Within       bool    `json:"within_target"`
		OvershootPct float64 `json:"overshoot_pct"`
	} `json:"candidates"`
}

func runTargetJSON(t *testing.T, args ...string) (targetJSON, string) {
	t.Helper()
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(append(args, "-json", "-quiet"), &out, &errb), errb.String())
	var res targetJSON
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	return res, out.String()
}

// answerMs is the answer in ms, 0 for none.
func (r targetJSON) answerMs() float64 {
	if r.AnswerMs == nil {
		return 0
	}
	return *r.AnswerMs
}

func TestTargetDeterministic(t *testing.T) {
	a, outA := runTargetJSON(t, append(targetScenario, "-target", "5%")...)
	_, outB := runTargetJSON(t, append(targetScenario, "-target", "5%")...)
	assert.Equal(t, outA, outB)
	assert.Equal(t, 54.0, a.answerMs())
	var rates []float64
	for _, c := range a.Candidates {
		rates = append(rates, c.SyncRateMs)
		if c.SyncRateMs == 54 {
			assert.True(t, c.Within)
			assert.LessOrEqual(t, c.OvershootPct, 5.0)
		}
		if c.SyncRateMs == 57 {
			assert.False(t, c.Within, "the next rate tried misses, 5%% apart")
		}
	}
	// The ladder up to the first batch that misses entirely (500ms, 1s),
	// then two rounds between 50ms and 100ms.
	assert.Equal(t, []float64{1, 2, 5, 10, 20, 50, 52, 54, 57, 59, 71, 84, 100, 200, 500, 1000}, rates)
}

func TestTargetMonotonic(t *testing.T) {
	prev := -1.0
	for _, p := range []string{"0%", "0.5%", "1%", "2%", "5%", "10%", "20%", "100%"} {
		res, _ := runTargetJSON(t, append(targetScenario, "-target", p)...)
		got := res.answerMs()
		assert.GreaterOrEqual(t, got, prev, "-target %s: a looser target gives a rate at least as slow", p)
		prev = got
	}
	assert.Equal(t, 1000.0, prev, "+100%: every rate up to the window")
}

func TestTargetTable(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(append(targetScenario, "-target", "1%", "-quiet"), &out, &errb), errb.String())
	s := out.String()
	assert.Contains(t, s, "target: admitted within +1% of the exact reference; async sync rates from 1ms to 1s, refined to within 10%")
	assert.Contains(t, s, "answer: naive:14ms (overshoot +0.74%", "the naive policy, as -modes names it")
	assert.Contains(t, s, "caution: faster rates missed the target: 1ms (+1.42%), 2ms (+1.21%)")

	out.Reset()
	require.Equal(t, 0, run(append(targetScenario, "-target", "0%", "-quiet"), &out, &errb), errb.String())
	assert.Contains(t, out.String(), "answer: none. Even naive:1ms overshoots by +1.42%, more than +0%: use the synchronous mode (-modes sync)")
	res, _ := runTargetJSON(t, append(targetScenario, "-target", "0%")...)
	assert.True(t, res.UseSyncMode)
	assert.Nil(t, res.AnswerMs)
	assert.Len(t, res.Candidates, 4, "one batch of the ladder, all missing")
}

// -target searches the traffic of a trace too, and draws the candidates.
func TestTargetTrace(t *testing.T) {
	var b strings.Builder
	for i := range 4000 {
		b.WriteString(virtualStart.Add(time.Duration(i) * time.Millisecond).Format(traceTimeLayout))
		b.WriteString(",k" + string(rune('a'+i%3)) + "\n")
	}
	path := writeFile(t, "t.csv", b.String())
	plot := filepath.Join(t.TempDir(), "c.svg")
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"-trace", path, "-rules", "100/1s", "-nodes", "3", "-target", "10%", "-plot", plot, "-quiet"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "3 nodes · trace "+path)
	assert.Contains(t, out.String(), "answer: async:")
}
