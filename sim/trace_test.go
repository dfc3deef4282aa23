package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
)

// writeFile writes content to a file of the test's temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

type replayed struct {
	at  time.Duration
	key string
}

// replay parses the command line with -trace path and returns the requests
// of a run, as the driver sees them.
func replay(t *testing.T, path string, args ...string) (*options, []replayed) {
	t.Helper()
	o, err := parseFlags(append([]string{"-trace", path}, args...), io.Discard)
	require.NoError(t, err)
	src, err := newSource(o)
	require.NoError(t, err)
	defer src.close()
	var out []replayed
	for q, ok := src.next(); ok; q, ok = src.next() {
		out = append(out, replayed{time.Duration(q.at), o.trace.names[q.key]})
	}
	require.NoError(t, src.err())
	return o, out
}

const ms = time.Millisecond

func TestTraceFormats(t *testing.T) {
	for _, tc := range []struct {
		name, file, content string
		format              traceFormat
		want                []replayed
		dur                 time.Duration
		reordered           int64
	}{
		{
			name: "csv rfc3339 odd keys", file: "t.csv", format: formatCSV,
			content: "# a comment, with a comma\n\ntimestamp,key\n" +
				"2030-01-01T00:00:00Z,alice\n" +
				"2030-01-01T00:00:00.25Z,\"b,ob\"\n" +
				"2030-01-01T00:00:00.5+00:00,\"say \"\"hi\"\"\"\n" +
				"2030-01-01T01:00:01.000000001+01:00,\"multi\nline\"\n" +
				"# a comment between requests\n" +
				"2030-01-01T00:00:01.5Z,  \"  spaced {tag}:ü  \"\r\n",
			want: []replayed{{0, "alice"}, {250 * ms, "b,ob"}, {500 * ms, `say "hi"`}, {time.Second + 1, "multi\nline"}, {1500 * ms, "  spaced {tag}:ü  "}},
			dur:  1501 * ms,
		},
		{
			name: "csv unix seconds", file: "t.txt", format: formatCSV,
			content: "1893456000,a\n1893456000.000000001,b\n1893456000.5,a\n1893456000.4,c\n",
			want:    []replayed{{0, "a"}, {1, "b"}, {500 * ms, "a"}, {500 * ms, "c"}},
			dur:     501 * ms, reordered: 1,
		},
		{
			name: "csv unix milliseconds", file: "t", format: formatCSV,
			content: "ts,key\n1893456000000,a\n1893456000250,b\n",
			want:    []replayed{{0, "a"}, {250 * ms, "b"}},
			dur:     251 * ms,
		},
		{
			name: "json lines", file: "t.jsonl", format: formatJSON,
			content: `{"ts": 1893456000, "key": "a"}` + "\n" +
				`{"key": "é\"\n{x}", "ts": 1893456000.25, "extra": [1]}` + "\n" +
				"\n# comment\n" +
				`  {"ts": "1893456001", "key": "a"}` + "\n",
			want: []replayed{{0, "a"}, {250 * ms, "é\"\n{x}"}, {time.Second, "a"}},
			dur:  1001 * ms,
		},
		{
			name: "json lines rfc3339", file: "t.ndjson", format: formatJSON,
			content: `{"ts":"2030-01-01T00:00:00.5Z","key":"k 1"}` + "\n" + `{"ts":"2030-01-01T00:00:02Z","key":"k 2"}`,
			want:    []replayed{{0, "k 1"}, {1500 * ms, "k 2"}},
			dur:     1501 * ms,
		},
		{
			// One second's requests are spread over it; a line logged late
			// is replayed in the second of the line before it.
			name: "common and combined log format", file: "access.log", format: formatCLF,
			content: `127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326` + "\n" +
				`::1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 10 "http://x/" "Mozilla/5.0 (X11; Linux)"` + "\n" +
				`10.0.0.2 - - [10/Oct/2000:13:55:37 -0700] "POST /login HTTP/1.1" 401 0 "-" "curl/8"` + "\n" +
				`10.0.0.3 - - [10/Oct/2000:13:55:36 -0700] "GET /late HTTP/1.1" 200 5` + "\n",
			want:      []replayed{{0, "127.0.0.1"}, {500 * ms, "::1"}, {time.Second, "10.0.0.2"}, {1500 * ms, "10.0.0.3"}},
			dur:       2 * time.Second,
			reordered: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, got := replay(t, writeFile(t, tc.file, tc.content))
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.format, o.trace.format)
			assert.Equal(t, tc.dur, o.Duration)
			assert.Equal(t, tc.reordered, o.trace.reordered)
			assert.Equal(t, int64(len(tc.want)), o.trace.requests)
			assert.Equal(t, "trace", o.Pattern)
		})
	}
}

func TestTraceGzipAndDirectives(t *testing.T) {
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	_, _ = gz.Write([]byte("# start=2030-01-01T00:00:00Z end=2030-01-01T00:00:03Z\n2030-01-01T00:00:01Z,a\n2030-01-01T00:00:02Z,b\n2030-01-01T00:00:03Z,c\n"))
	require.NoError(t, gz.Close())
	o, got := replay(t, writeFile(t, "t.csv.gz", b.String()))
	assert.Equal(t, []replayed{{time.Second, "a"}, {2 * time.Second, "b"}}, got, "times from start=, none at or after end=")
	assert.Equal(t, 3*time.Second, o.Duration)
	assert.True(t, o.trace.cut)
}

// -duration truncates the trace, or extends the run past its last request.
func TestTraceDuration(t *testing.T) {
	path := writeFile(t, "t.csv", "0,a\n0.5,b\n1,c\n2.5,d\n")
	o, got := replay(t, path, "-duration", "1s")
	assert.Equal(t, []replayed{{0, "a"}, {500 * ms, "b"}}, got)
	assert.Equal(t, time.Second, o.Duration)
	assert.Equal(t, 2, o.Keys, "keys after the cut are not read")
	o, got = replay(t, path, "-duration", "10s")
	assert.Len(t, got, 4)
	assert.Equal(t, 10*time.Second, o.Duration)
	o, _ = replay(t, path)
	assert.Equal(t, 2501*ms, o.Duration)
	assert.Equal(t, time.Second, o.Bucket)
	o, _ = replay(t, path, "-duration", "300ms")
	assert.Equal(t, 300*ms, o.Bucket, "the default bucket is at most the run")
}

func TestTraceBadLines(t *testing.T) {
	for _, tc := range []struct{ name, content, want string }{
		{"csv timestamp", "# c\nts,key\n1,a\nyesterday,b\n2,c\n", `line 4: timestamp "yesterday" is not RFC 3339 (2030-01-01T00:00:00.25Z), Unix seconds (1893456000.25) or Unix milliseconds (1893456000250)`},
		{"csv fields", "1,a\n2,b,c\n3,d\n", "line 2: has 3 fields, want 2"},
		{"csv quote", "1,a\n2,b\"x\n3,d\n", `line 2: bare " in non-quoted-field`},
		{"csv kinds", "1,a\n2030-01-01T00:00:02Z,b\n3,d\n", "line 2: timestamp \"2030-01-01T00:00:02Z\" is RFC 3339, but the first request's is Unix seconds"},
		{"csv empty key", "1,a\n2,\n3,d\n", "line 2: empty key"},
		{"csv long key", "1,a\n2," + strings.Repeat("k", 1025) + "\n3,d\n", "line 2: key of 1025 bytes, want at most 1024"},
		{"json", "{\"ts\":1,\"key\":\"a\"}\n{\"ts\":2}\n{\"ts\":3,\"key\":\"d\"}\n", `line 2: no "key" string`},
		{"json number key", "{\"ts\":1,\"key\":\"a\"}\n{\"ts\":2,\"key\":7}\n{\"ts\":3,\"key\":\"d\"}\n", "line 2: not a JSON object"},
		{"clf", "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n1.2.3.5 - - [10/Oct/2000:25:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n1.2.3.6 - - [10/Oct/2000:13:55:37 -0700] \"GET / HTTP/1.0\" 200 1\n", "line 2: date [10/Oct/2000:25:55:36 -0700] is not like"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "t", tc.content)
			_, err := parseFlags([]string{"-trace", path}, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "-trace-skip-bad")

			var out, errb bytes.Buffer
			assert.Equal(t, 1, run([]string{"-trace", path}, &out, &errb), "a bad trace is a failed run")
			assert.Contains(t, errb.String(), tc.want)

			o, got := replay(t, path, "-trace-skip-bad")
			assert.Len(t, got, 2)
			assert.Equal(t, int64(1), o.trace.skipped)
		})
	}
}

func TestTraceTableHeader(t *testing.T) {
	path := writeFile(t, "t.csv", "0,a\n0.5,b\nnope,c\n0.25,d\n1,a\n")
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"-trace", path, "-trace-skip-bad", "-spread", "hash", "-nodes", "2", "-modes", "local", "-quiet"}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "2 nodes · trace "+path+" (CSV, 4 requests, 3 keys, from 1970-01-01T00:00:00Z, 1 malformed lines skipped, 1 out of time order replayed at the instant before them) · spread hash")
	reps, _ := runJSON(t, "-trace", path, "-trace-skip-bad", "-nodes", "2", "-modes", "local")
	assert.Equal(t, "trace", reps[0]["pattern"])
	assert.Equal(t, path, reps[0]["trace"])
	assert.Equal(t, 1.0, reps[0]["trace_skipped"])
	assert.Equal(t, 1.0, reps[0]["trace_reordered"])
	assert.Equal(t, 4.0, reps[0]["requests"])
}

// The reference decides exactly the trace's requests, at the trace's
// instants: here, by hand, 5 of the first 12 (limit 5/1s) and, at 1.5s,
// 2 more (the previous window weighs 5·0.5 = 2.5).
func TestTraceReferenceSeesTrace(t *testing.T) {
	var b strings.Builder
	var want []replayed
	for i := range 12 {
		want = append(want, replayed{time.Duration(i) * ms, "k"})
	}
	for i := range 10 {
		want = append(want, replayed{1500*ms + time.Duration(i)*ms, "k"})
	}
	for _, r := range want {
		b.WriteString(virtualStart.Add(r.at).Format(traceTimeLayout) + ",k\n")
	}
	path := writeFile(t, "t.csv", b.String())
	o, got := replay(t, path, "-rules", "5/1s")
	require.Equal(t, want, got)

	ref := newReference(&options{Keys: 1, Rules: []hybridlimit.Rule{{Limit: 5, Window: time.Second}}})
	ideal := 0.0
	for _, r := range want {
		if ref.allow(0, virtualStart.Add(r.at).UnixNano()) {
			ideal++
		}
	}
	assert.Equal(t, 7.0, ideal)
	assert.Equal(t, 1, o.Keys)
	reps, _ := runJSON(t, "-trace", path, "-rules", "5/1s", "-nodes", "1", "-modes", "sync,local")
	for _, r := range reps {
		assert.Equal(t, 22.0, r["requests"])
		assert.Equal(t, ideal, r["ideal"])
		assert.Equal(t, ideal, r["admitted"], "one node deciding every request is the reference")
	}
}

func TestTraceDeterminism(t *testing.T) {
	var b strings.Builder
	for i := range 3000 {
		b.WriteString("10.0.0." + string(rune('0'+i%7)) + " - - [10/Oct/2000:13:55:" + string(rune('0'+i/1000)) + "0 -0700] \"GET / HTTP/1.1\" 200 1\n")
	}
	path := writeFile(t, "access.log", b.String())
	args := []string{"-trace", path, "-rules", "50/1s", "-nodes", "3", "-modes", "sync,async:50ms", "-churn", "1@5s+5s"}
	_, a := runJSON(t, append(args, "-spread", "hash")...)
	_, c := runJSON(t, append(args, "-spread", "hash")...)
	assert.Equal(t, a, c)
	_, d := runJSON(t, append(args, "-spread", "rr")...)
	assert.NotEqual(t, a, d, "-spread changes which node decides")
}

// Generated traffic, written with -write-trace and replayed with -trace,
// gives the same figures as the generated run.
func TestTraceRoundTrip(t *testing.T) {
	for _, tc := range []struct{ gen, run []string }{
		{[]string{"-duration", "5s", "-rate", "3000", "-keys", "7", "-pattern", "burst", "-seed", "3"}, []string{"-nodes", "4", "-skew", "20ms", "-outage", "2s+1s", "-seed", "3"}},
		{[]string{"-duration", "3s", "-keys", "40", "-pattern", "zipf", "-rules", "20/1s,200/1m"}, []string{"-nodes", "3", "-spread", "hash", "-churn", "1@1s+1s"}},
	} {
		path := filepath.Join(t.TempDir(), "gen.csv")
		var out, errb bytes.Buffer
		require.Equal(t, 0, run(append(tc.gen, "-write-trace", path, "-quiet"), &out, &errb), errb.String())
		assert.Empty(t, out.String())
		modes := []string{"-modes", "local,sync,async:10ms,async:200ms"}
		var rules []string
		if i := indexOf(tc.gen, "-rules"); i >= 0 {
			rules = tc.gen[i : i+2]
		}
		gen, _ := runJSON(t, append(append(tc.gen, tc.run...), modes...)...)
		rep, _ := runJSON(t, append(append(append([]string{"-trace", path}, rules...), tc.run...), modes...)...)
		require.Len(t, rep, len(gen))
		for i := range gen {
			for _, f := range []string{"requests", "admitted", "ideal", "overshoot_pct", "false_deny_pct", "peak_window_ratio", "ideal_peak_window_ratio", "store_calls", "keys_pushed", "false_denied", "store_failures", "degraded", "duration_s", "keys"} {
				assert.Equal(t, gen[i][f], rep[i][f], "%v %s", gen[i]["mode"], f)
			}
			assert.Greater(t, gen[i]["requests"], 500.0)
		}
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestTraceMissingFile(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 1, run([]string{"-trace", filepath.Join(t.TempDir(), "none.csv")}, &out, &errb))
	assert.Contains(t, errb.String(), "sim: trace: open ")
	assert.Contains(t, errb.String(), "no such file or directory")
}

// -warmup must leave part of a trace to measure: at or past the trace's
// length it is refused, naming the length.
func TestTraceWarmupPastItsEnd(t *testing.T) {
	path := writeFile(t, "t.csv", "1893456000,a\n1893456000.5,b\n")
	_, err := parseFlags([]string{"-trace", path, "-warmup", "1s"}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-warmup is 1s, want 0 to less than the trace's length (501ms)")
	_, err = parseFlags([]string{"-trace", path, "-warmup", "100ms"}, io.Discard)
	assert.NoError(t, err)
}
