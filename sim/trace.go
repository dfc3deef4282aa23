package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"
)

// traceFormat is the format of a trace file, detected from its first
// request line (see docs/simulation.md).
type traceFormat int

const (
	formatCSV  traceFormat = iota // timestamp,key
	formatJSON                    // {"ts": ..., "key": "..."} per line
	formatCLF                     // Common or Combined Log Format, keyed by client address
)

func (f traceFormat) String() string {
	switch f {
	case formatJSON:
		return "JSON lines"
	case formatCLF:
		return "Common Log Format"
	}
	return "CSV"
}

// tsKind is how a trace spells its timestamps. Every request of a trace
// must use the kind of its first request.
type tsKind int

const (
	tsNone    tsKind = iota
	tsRFC3339        // 2030-01-01T00:00:00.25Z
	tsUnixS          // 1893456000.25
	tsUnixMs         // 1893456000250
	tsCLF            // 01/Jan/2030:00:00:00 +0000
)

func (k tsKind) String() string {
	return [...]string{"none", "RFC 3339", "Unix seconds", "Unix milliseconds", "a log date"}[k]
}

const (
	// maxTraceKey is the longest key of a trace, in bytes: the library's
	// default Config.MaxKeyLen.
	maxTraceKey = 1024
	// maxTraceLine is the longest line of a JSON or CLF trace, in bytes.
	maxTraceLine = 1 << 20
	// clfLayout is the date of the Common Log Format.
	clfLayout = "02/Jan/2006:15:04:05 -0700"
)

// lineError is a malformed line of a trace: -trace-skip-bad skips it.
type lineError struct {
	line int
	msg  string
}

func (e *lineError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

// traceReader reads the requests of a trace file in file order, one at a
// time: it holds one line, never the file. Lines before the first request
// that are blank or start with '#' are comments; among them `start=TIME`
// and `end=TIME` fix the trace's span. Later '#' lines and blank lines are
// skipped. A file starting with the gzip magic is decompressed.
type traceReader struct {
	f      *os.File
	br     *bufio.Reader
	format traceFormat
	kind   tsKind
	line   int // lines consumed so far
	last   int // line of the last request read
	head   int // lines before the first request
	csv    *csv.Reader
	buf    []byte

	start, end       int64 // ns since the epoch
	hasStart, hasEnd bool
}

// clfLine is how detection recognises the Common Log Format:
// HOST IDENT USER [DATE] "REQUEST" ...
var clfLine = regexp.MustCompile(`^\S+ \S+ .*\[[^\]]+\] "`)

// openTrace opens path, reads its comment lines and detects its format.
func openTrace(path string) (*traceReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r := &traceReader{f: f, br: bufio.NewReaderSize(f, 64<<10)}
	if magic, _ := r.br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(r.br)
		if err != nil {
			f.Close()
			return nil, err
		}
		r.br = bufio.NewReaderSize(gz, 64<<10)
	}
	if err := r.readHead(); err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// Close closes the file.
func (r *traceReader) Close() error { return r.f.Close() }

// readHead consumes the comment lines before the first request and looks
// at the first request line, without consuming it, to detect the format.
func (r *traceReader) readHead() error {
	for {
		b, err := r.br.Peek(1)
		if len(b) == 0 {
			if err == io.EOF {
				break
			}
			return err
		}
		if b[0] != '#' && b[0] != '\n' && b[0] != '\r' {
			break
		}
		line, err := r.readLine()
		if err != nil {
			return err
		}
		if err := r.directives(string(line)); err != nil {
			return err
		}
	}
	r.head = r.line
	first, _ := r.br.Peek(4096) // fewer at the end of the file
	if i := bytes.IndexByte(first, '\n'); i >= 0 {
		first = first[:i]
	}
	switch {
	case bytes.HasPrefix(bytes.TrimSpace(first), []byte("{")):
		r.format = formatJSON
	case clfLine.Match(first):
		r.format = formatCLF
		r.kind = tsCLF
	default:
		r.format = formatCSV
		r.csv = csv.NewReader(r.br)
		r.csv.FieldsPerRecord = -1
		r.csv.ReuseRecord = true
		r.csv.Comment = '#'
		r.csv.TrimLeadingSpace = true
	}
	return nil
}

// directives reads start= and end= from a comment line.
func (r *traceReader) directives(line string) error {
	for _, f := range strings.Fields(strings.TrimPrefix(line, "#")) {
		name, val, _ := strings.Cut(f, "=")
		if name != "start" && name != "end" {
			continue
		}
		ns, _, err := parseTimestamp(val)
		if err != nil {
			return &lineError{r.line, fmt.Sprintf("%s=: %v", name, err)}
		}
		if name == "start" {
			r.start, r.hasStart = ns, true
		} else {
			r.end, r.hasEnd = ns, true
		}
	}
	if r.hasStart && r.hasEnd && r.end <= r.start {
		return &lineError{r.line, "end= is not after start="}
	}
	return nil
}

// readLine returns the next line without its end of line. A line longer
// than maxTraceLine is consumed and reported as a *lineError.
func (r *traceReader) readLine() ([]byte, error) {
	r.buf = r.buf[:0]
	long := false
	for {
		chunk, err := r.br.ReadSlice('\n')
		if !long && len(r.buf)+len(chunk) > maxTraceLine {
			long = true
		}
		if !long {
			r.buf = append(r.buf, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && (len(r.buf) > 0 || long) {
			err = nil // a last line without a newline
		}
		if err != nil {
			return nil, err
		}
		r.line++
		if long {
			return nil, &lineError{r.line, fmt.Sprintf("longer than %d bytes", maxTraceLine)}
		}
		return bytes.TrimRight(r.buf, "\r\n"), nil
	}
}

// next returns the next request: its instant in ns since the epoch and its
// key. The error is io.EOF at the end, a *lineError for a malformed line
// (reading may go on), or a read error.
func (r *traceReader) next() (int64, string, error) {
	if r.format == formatCSV {
		return r.nextCSV()
	}
	for {
		line, err := r.readLine()
		if err != nil {
			return 0, "", err
		}
		if len(bytes.TrimSpace(line)) == 0 || line[0] == '#' {
			continue
		}
		var ts int64
		var key string
		r.last = r.line
		if r.format == formatJSON {
			ts, key, err = r.parseJSON(line)
		} else {
			ts, key, err = parseCLF(string(line))
		}
		if err != nil {
			return 0, "", &lineError{r.line, err.Error()}
		}
		return ts, key, nil
	}
}

func (r *traceReader) nextCSV() (int64, string, error) {
	for {
		rec, err := r.csv.Read()
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return 0, "", &lineError{r.head + pe.StartLine, pe.Err.Error()}
		}
		if err != nil {
			return 0, "", err
		}
		line, _ := r.csv.FieldPos(0)
		line += r.head
		r.last = line
		if len(rec) != 2 {
			return 0, "", &lineError{line, fmt.Sprintf("has %d fields, want 2: timestamp,key (quote a key that holds a comma)", len(rec))}
		}
		if r.kind == tsNone && isHeader(rec[0]) {
			continue
		}
		ts, err := r.timestamp(rec[0])
		if err == nil {
			err = checkKey(rec[1])
		}
		if err != nil {
			return 0, "", &lineError{line, err.Error()}
		}
		return ts, rec[1], nil
	}
}

// isHeader reports whether a first CSV field names the column.
func isHeader(s string) bool {
	s = strings.ToLower(s)
	return s == "timestamp" || s == "ts" || s == "time"
}

// timestamp parses s and checks it is of the trace's kind.
func (r *traceReader) timestamp(s string) (int64, error) {
	ns, kind, err := parseTimestamp(s)
	if err != nil {
		return 0, err
	}
	if r.kind == tsNone {
		r.kind = kind
	} else if kind != r.kind {
		return 0, fmt.Errorf("timestamp %q is %v, but the first request's is %v: a trace uses one kind", s, kind, r.kind)
	}
	return ns, nil
}

func (r *traceReader) parseJSON(line []byte) (int64, string, error) {
	var v struct {
		TS  json.RawMessage `json:"ts"`
		Key *string         `json:"key"`
	}
	if err := json.Unmarshal(line, &v); err != nil {
		return 0, "", fmt.Errorf("not a JSON object with \"ts\" and \"key\": %v", err)
	}
	if len(v.TS) == 0 || string(v.TS) == "null" {
		return 0, "", errors.New(`no "ts"`)
	}
	if v.Key == nil {
		return 0, "", errors.New(`no "key" string`)
	}
	ts := string(v.TS)
	if ts[0] == '"' {
		if err := json.Unmarshal(v.TS, &ts); err != nil {
			return 0, "", err
		}
	}
	ns, err := r.timestamp(ts)
	if err == nil {
		err = checkKey(*v.Key)
	}
	return ns, *v.Key, err
}

// parseCLF parses a Common or Combined Log Format line: the key is the
// client address (the first field), the instant the bracketed date.
func parseCLF(line string) (int64, string, error) {
	host, rest, _ := strings.Cut(line, " ")
	open := strings.IndexByte(rest, '[')
	end := strings.IndexByte(rest, ']')
	if host == "" || open < 0 || end < open || len(strings.Fields(rest[:open])) < 2 {
		return 0, "", errors.New("not HOST IDENT USER [DATE] \"REQUEST\" ... (Common Log Format)")
	}
	t, err := time.Parse(clfLayout, rest[open+1:end])
	if err != nil {
		return 0, "", fmt.Errorf("date [%s] is not like [10/Oct/2000:13:55:36 -0700]", rest[open+1:end])
	}
	if !strings.HasPrefix(rest[end+1:], ` "`) {
		return 0, "", errors.New(`no "REQUEST" after the date`)
	}
	if t.Year() < 1678 || t.Year() > 2261 {
		return 0, "", fmt.Errorf("date [%s] is out of range", rest[open+1:end])
	}
	return t.UnixNano(), host, checkKey(host)
}

func checkKey(k string) error {
	switch {
	case k == "":
		return errors.New("empty key")
	case len(k) > maxTraceKey:
		return fmt.Errorf("key of %d bytes, want at most %d", len(k), maxTraceKey)
	}
	return nil
}
