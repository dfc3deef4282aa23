package main

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// timeline turns a trace's requests, in file order, into the run's:
// instants in ns from the run's start, never going back (a request logged
// before the one above it is replayed at that one's instant, and counted),
// the requests of one Common Log Format second spread evenly over it (its
// dates have whole seconds), and none at or after the limit.
type timeline struct {
	r       *traceReader
	skipBad bool
	limit   int64 // ns from the start; 0: none (then end= sets it, if given)

	t0, latest int64 // ns since the epoch
	started    bool
	done, eof  bool

	skipped, reordered int64

	// Common Log Format: the keys of one second, and the first request of
	// the next.
	group    []string
	gsec, gi int64
	ahead    string
	aheadAt  int64
	hasAhead bool
}

// read returns the next well-formed request, its instant clamped and made
// relative to the start.
func (t *timeline) read() (int64, string, error) {
	for {
		if t.eof {
			return 0, "", io.EOF
		}
		ts, key, err := t.r.next()
		var le *lineError
		if errors.As(err, &le) && t.skipBad {
			t.skipped++
			continue
		}
		if errors.Is(err, io.EOF) {
			t.eof = true
		}
		if err != nil {
			return 0, "", err
		}
		if !t.started {
			t.started = true
			t.t0 = ts
			if t.r.hasStart {
				t.t0 = t.r.start
			}
			t.latest = t.t0
			if t.limit == 0 && t.r.hasEnd {
				if t.limit = t.r.end - t.t0; t.limit <= 0 {
					return 0, "", fmt.Errorf("end= is not after the first request (line %d)", t.r.last)
				}
			}
		}
		if ts < t.t0 {
			if t.skipBad {
				t.skipped++
				continue
			}
			return 0, "", &lineError{t.r.last, "before the trace's start="}
		}
		if ts < t.latest {
			t.reordered++
			ts = t.latest
		}
		t.latest = ts
		return ts - t.t0, key, nil
	}
}

// next returns the next request of the run, or io.EOF.
func (t *timeline) next() (int64, string, error) {
	if t.done {
		return 0, "", io.EOF
	}
	var at int64
	var key string
	if t.r.format != formatCLF {
		var err error
		if at, key, err = t.read(); err != nil {
			return 0, "", err
		}
	} else {
		if t.gi == int64(len(t.group)) {
			if err := t.fill(); err != nil {
				return 0, "", err
			}
		}
		at = t.gsec + t.gi*int64(time.Second)/int64(len(t.group))
		key = t.group[t.gi]
		t.gi++
	}
	if t.limit > 0 && at >= t.limit {
		t.done = true
		return 0, "", io.EOF
	}
	return at, key, nil
}

// fill reads the requests of the next second of a Common Log Format trace.
func (t *timeline) fill() error {
	t.group, t.gi = t.group[:0], 0
	if !t.hasAhead {
		at, key, err := t.read()
		if err != nil {
			return err
		}
		t.ahead, t.aheadAt = key, at
	}
	t.gsec, t.hasAhead = t.aheadAt, false
	t.group = append(t.group, t.ahead)
	for {
		at, key, err := t.read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if at != t.gsec {
			t.ahead, t.aheadAt, t.hasAhead = key, at, true
			return nil
		}
		t.group = append(t.group, key)
	}
}

// traceInfo is what the first pass over a trace learns: the keys table,
// the counts and the run's length. The replays share it, read-only.
type traceInfo struct {
	format    traceFormat
	kind      tsKind
	keys      map[string]int
	names     []string
	requests  int64
	skipped   int64 // malformed lines skipped (-trace-skip-bad)
	reordered int64 // requests earlier than the one before them
	start     time.Time
	dur       time.Duration
	cut       bool // requests at or after dur were left out
}

// scanTrace reads the trace at path once, streaming: it checks every line
// up to limit (0: the whole file, or its end=), builds the keys table and
// measures the run's length: limit if given, else up to end= if given,
// else just after the last request (the next whole millisecond; in the
// Common Log Format, the end of its second).
func scanTrace(path string, skipBad bool, limit time.Duration) (*traceInfo, error) {
	r, err := openTrace(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer r.Close()
	t := &timeline{r: r, skipBad: skipBad, limit: int64(limit)}
	info := &traceInfo{keys: map[string]int{}}
	var last int64
	for {
		at, key, err := t.next()
		if errors.Is(err, io.EOF) {
			break
		}
		var le *lineError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("trace %s: %w (-trace-skip-bad skips malformed lines)", path, err)
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", path, err)
		}
		if _, ok := info.keys[key]; !ok {
			info.keys[key] = len(info.names)
			info.names = append(info.names, key)
		}
		info.requests++
		last = at
	}
	info.format, info.kind = r.format, r.kind
	info.skipped, info.reordered, info.cut = t.skipped, t.reordered, t.done
	if info.requests == 0 {
		return nil, fmt.Errorf("trace %s: no requests (%d malformed lines skipped)", path, t.skipped)
	}
	info.start = time.Unix(0, t.t0).UTC()
	switch {
	case t.limit > 0:
		info.dur = time.Duration(t.limit)
	case r.format == formatCLF:
		info.dur = time.Duration(t.gsec) + time.Second
	default:
		info.dur = time.Duration(last).Truncate(time.Millisecond) + time.Millisecond
	}
	return info, nil
}

// traceSource replays a scanned trace: the second pass, streaming.
type traceSource struct {
	r    *traceReader
	tl   *timeline
	info *traceInfo
	path string
	fail error
}

func newTraceSource(o *options) (*traceSource, error) {
	r, err := openTrace(o.Trace)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return &traceSource{r: r, tl: &timeline{r: r, skipBad: o.TraceSkipBad, limit: int64(o.Duration)}, info: o.trace, path: o.Trace}, nil
}

func (s *traceSource) next() (request, bool) {
	at, key, err := s.tl.next()
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.fail = fmt.Errorf("trace %s: %w", s.path, err)
		}
		return request{}, false
	}
	i, ok := s.info.keys[key]
	if !ok {
		s.fail = fmt.Errorf("trace %s: line %d: key %q was not there on the first pass: did the file change?", s.path, s.r.last, key)
		return request{}, false
	}
	return request{at: at, key: i}, true
}

func (s *traceSource) err() error   { return s.fail }
func (s *traceSource) close() error { return s.r.Close() }

// traceTimeLayout is RFC 3339 with every nanosecond digit, as -write-trace
// writes it.
const traceTimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// writeTrace writes the generated traffic of o to o.WriteTrace as CSV. Its
// start= and end= comment make a replay start and end where the generated
// run does, so it gives the same figures.
func writeTrace(o *options, stderr io.Writer) error {
	f, err := os.Create(o.WriteTrace)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<16)
	fmt.Fprintf(bw, "# hybridlimit sim trace: -pattern %s, %d keys, %.0f req/s, -seed %d; replay: go run ./sim -trace FILE\n", o.Pattern, o.Keys, o.Rate, o.Seed)
	fmt.Fprintf(bw, "# start=%s end=%s\n", virtualStart.Format(traceTimeLayout), virtualStart.Add(o.Duration).Format(traceTimeLayout))
	cw := csv.NewWriter(bw)
	_ = cw.Write([]string{"timestamp", "key"})
	g := newTraffic(o)
	names := keyNames(o.Keys)
	rec := make([]string, 2)
	var n int64
	for q, ok := g.next(); ok; q, ok = g.next() {
		rec[0], rec[1] = virtualStart.Add(time.Duration(q.at)).Format(traceTimeLayout), names[q.key]
		_ = cw.Write(rec)
		n++
	}
	cw.Flush()
	err = cw.Error()
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", o.WriteTrace, err)
	}
	if !o.Quiet {
		fmt.Fprintf(stderr, "sim: wrote %d requests over %v (%d keys, -pattern %s, -seed %d) to %s\n", n, o.Duration, o.Keys, o.Pattern, o.Seed, o.WriteTrace)
	}
	return nil
}
